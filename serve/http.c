/* The HTTP front of `ember serve`: libmicrohttpd (a thread per connection,
 * HTTP/1.1 keep-alive) speaking the KServe v2 / Open Inference Protocol REST
 * API, Prometheus metrics, and the graceful drain on SIGTERM / SIGINT.
 *
 *   GET  /v2/health/live                      200 while the process runs
 *   GET  /v2/health/ready                     200 when serving, 503 while draining
 *   GET  /v2                                  server metadata
 *   GET  /v2/models/{m}[/versions/{v}]        model metadata
 *   GET  /v2/models/{m}[/versions/{v}]/ready  200 ready, 404 unknown
 *   POST /v2/models/{m}[/versions/{v}]/infer  inference (JSON or the binary extension)
 *   GET  /metrics                             Prometheus text format 0.0.4
 *
 * Errors are {"error": "..."} with 400 (bad request), 404 (no such model or
 * path), 405 (wrong method), 413 (body too large), 415 (compressed body),
 * 503 (queue full or draining), 504 (request timeout), 500 (the forward failed).
 */
#define _GNU_SOURCE
#include "serve/serve_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

typedef struct server {
    const ems_options *o;
    ems_repo repo;
    struct MHD_Daemon *d;
    atomic_int draining;
    atomic_llong in_flight;
    atomic_ullong http[6];
    atomic_ullong served;
    atomic_size_t buffered;  /* request body bytes held by all connections */
    /* idle pausing of StarPU's workers (em_pause_workers), under idle_mu */
    pthread_mutex_t idle_mu;
    pthread_cond_t idle_cv;
    int active;          /* infer requests between decode and response */
    bool paused, idle_stop;
    double last_active;
    pthread_t idle_thread;
    bool idle_started;
} server;

/* StarPU's CPU workers spin while they wait for tasks, so an idle server
 * would keep every core it owns busy. The workers are paused once no infer
 * request has been active for EMS_IDLE_PAUSE_S, and resumed by the next
 * request before it reaches a model (em_pause_workers). */
#define EMS_IDLE_PAUSE_S 0.05
/* the drain ends once nothing has been in flight for this long (seconds) */
#define EMS_DRAIN_GRACE_S 0.1

static void active_begin(server *s)
{
    pthread_mutex_lock(&s->idle_mu);
    s->active++;
    if (s->paused) {
        em_resume_workers();
        s->paused = false;
    }
    pthread_mutex_unlock(&s->idle_mu);
}

static void active_end(server *s)
{
    pthread_mutex_lock(&s->idle_mu);
    s->active--;
    s->last_active = ems_now();
    if (s->active == 0) pthread_cond_signal(&s->idle_cv);
    pthread_mutex_unlock(&s->idle_mu);
}

static void *idle_main(void *arg)
{
    server *s = arg;
    pthread_mutex_lock(&s->idle_mu);
    while (!s->idle_stop) {
        double now = ems_now();
        if (!s->paused && s->active == 0 && now - s->last_active >= EMS_IDLE_PAUSE_S) {
            em_pause_workers();
            s->paused = true;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        long ns = ts.tv_nsec + (long)(1e9 * EMS_IDLE_PAUSE_S);
        ts.tv_sec += ns / 1000000000L;
        ts.tv_nsec = ns % 1000000000L;
        pthread_cond_timedwait(&s->idle_cv, &s->idle_mu, &ts);
    }
    if (s->paused) {
        em_resume_workers();
        s->paused = false;
    }
    pthread_mutex_unlock(&s->idle_mu);
    return NULL;
}

/* per-request state (MHD's con_cls) */
typedef struct req_ctx {
    char *body;
    size_t n, cap;
    size_t limit;         /**< the largest body this request may have (bytes) */
    bool too_big, counted, over_budget, answered;
    int bad_encoding;
} req_ctx;

/* ---- signals: a self-pipe, so that a SIGTERM on any thread (libraries start
 * threads before main whose masks we do not set) reaches the main loop ---- */
static int g_sig_pipe[2] = {-1, -1};

static void on_signal(int sig)
{
    unsigned char b = (unsigned char)sig;
    int saved = errno;
    if (write(g_sig_pipe[1], &b, 1) < 0) { /* full: a signal is pending already */
    }
    errno = saved;
}

int ems_signals_install(void)
{
    if (g_sig_pipe[0] < 0 && pipe2(g_sig_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return -1;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGINT, &sa, NULL) != 0 || sigaction(SIGTERM, &sa, NULL) != 0) return -1;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
    return 0;
}

/* The next signal the handler saw: its number, or 0 after @p timeout_ms (-1: wait). */
static int wait_signal(int timeout_ms)
{
    struct pollfd pf = {.fd = g_sig_pipe[0], .events = POLLIN};
    if (g_sig_pipe[0] < 0) return 0;
    for (;;) {
        int r = poll(&pf, 1, timeout_ms);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return 0;
        unsigned char b;
        if (read(g_sig_pipe[0], &b, 1) == 1) return b;
        return 0;
    }
}

/* The largest body an infer request of @p m can need: its JSON form (at most
 * 40 bytes per value, as -1.23456789e-38 with a comma and nesting, plus
 * 64 KiB for the rest) or its binary form, whichever is larger, for a full
 * batch of the largest samples. Bodies above it are refused before they are
 * read (or, when the JSON is what is too large, before it is parsed: a JSON
 * value costs jansson tens of bytes of memory). */
static size_t model_json_limit(const ems_model *m)
{
    int64_t per = m->kind == EMS_KIND_GPT ? m->max_seq : m->sample;
    double v = (double)m->cfg.max_batch_size * (double)per * 40.0 + 65536.0;
    return v > (double)SIZE_MAX / 2 ? SIZE_MAX / 2 : (size_t)v;
}

static size_t model_body_limit(const ems_model *m)
{
    int64_t per = m->kind == EMS_KIND_GPT ? m->max_seq : m->sample;
    double bin = (double)m->cfg.max_batch_size * (double)per * 8.0;
    double v = (double)model_json_limit(m) + bin;
    return v > (double)SIZE_MAX / 2 ? SIZE_MAX / 2 : (size_t)v;
}

ems_options ems_options_default(void)
{
    ems_options o;
    memset(&o, 0, sizeof o);
    o.host = "127.0.0.1";
    o.port = 8000;
    o.instances = "cpu:1,cuda:all";
    o.max_body_bytes = (size_t)64 << 20;
    o.limits = ems_limits_default();
    o.connection_limit = 1024;
    o.drain_timeout_s = 30;
    o.idle_timeout_s = 30;
    o.max_buffered_bytes = (size_t)1 << 30;
    return o;
}

static enum MHD_Result send_buf(server *s, struct MHD_Connection *c, unsigned status, char *body, size_t len, const char *ctype,
                                int64_t header_len)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", ctype);
    if (header_len >= 0) {
        char h[32];
        snprintf(h, sizeof h, "%lld", (long long)header_len);
        MHD_add_response_header(r, "Inference-Header-Content-Length", h);
    }
    if (status == 405) MHD_add_response_header(r, "Allow", "GET, HEAD, POST");
    /* draining: the client must not send another request on this connection */
    if (atomic_load(&s->draining)) MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    int cls = status >= 100 && status < 600 ? (int)(status / 100) - 1 : 5;
    atomic_fetch_add(&s->http[cls], 1);
    return ret;
}

static enum MHD_Result send_json(server *s, struct MHD_Connection *c, unsigned status, json_t *j)
{
    char *txt = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!txt) return MHD_NO;
    return send_buf(s, c, status, txt, strlen(txt), "application/json", -1);
}

static enum MHD_Result send_error(server *s, struct MHD_Connection *c, unsigned status, const char *msg)
{
    size_t len;
    char *b = ems_error_json(msg, &len);
    if (!b) return MHD_NO;
    return send_buf(s, c, status, b, len, "application/json", -1);
}

static enum MHD_Result send_empty(server *s, struct MHD_Connection *c, unsigned status)
{
    char *b = malloc(1);
    if (!b) return MHD_NO;
    return send_buf(s, c, status, b, 0, "text/plain", -1);
}

/* The model named @p name, version @p ver (NULL: the newest served). */
static ems_model *find_model(server *s, const char *name, const char *ver)
{
    ems_model *best = NULL;
    for (int i = 0; i < s->repo.n; i++) {
        ems_model *m = s->repo.models[i];
        if (strcmp(m->name, name)) continue;
        if (ver) {
            if (!strcmp(m->version_str, ver)) return m;
        } else if (!best || m->version > best->version) {
            best = m;
        }
    }
    return best;
}

static bool model_exists(server *s, const char *name)
{
    for (int i = 0; i < s->repo.n; i++)
        if (!strcmp(s->repo.models[i]->name, name)) return true;
    return false;
}

static json_t *shape_json(int64_t lead, const int64_t *dims, int nd)
{
    json_t *a = json_array();
    json_array_append_new(a, json_integer(lead));
    for (int i = 0; i < nd; i++) json_array_append_new(a, json_integer(dims[i]));
    return a;
}

static json_t *model_metadata(server *s, ems_model *m)
{
    json_t *j = json_object(), *vers = json_array(), *ins = json_array(), *outs = json_array();
    for (int i = 0; i < s->repo.n; i++)
        if (!strcmp(s->repo.models[i]->name, m->name)) json_array_append_new(vers, json_string(s->repo.models[i]->version_str));
    json_object_set_new(j, "name", json_string(m->name));
    json_object_set_new(j, "versions", vers);
    json_object_set_new(j, "platform", json_string(m->onnx ? "onnx" : "ember"));
    json_t *in = json_object();
    json_object_set_new(in, "name", json_string(m->cfg.input_name));
    json_object_set_new(in, "datatype", json_string(ems_dtype_name(m->cfg.input_dtype)));
    json_object_set_new(in, "shape", shape_json(-1, m->dims, m->ndim));
    json_array_append_new(ins, in);
    json_object_set_new(j, "inputs", ins);
    int64_t k = m->out_cols;
    for (int o = 0; o < (m->kind == EMS_KIND_GPT ? 1 : 2); o++) {
        json_t *x = json_object();
        json_object_set_new(x, "name", json_string(o ? "probabilities" : "logits"));
        json_object_set_new(x, "datatype", json_string("FP32"));
        json_object_set_new(x, "shape", shape_json(-1, &k, 1));
        json_array_append_new(outs, x);
    }
    json_object_set_new(j, "outputs", outs);
    return j;
}

/* Splits "/v2/models/NAME[/versions/V][/TAIL]": 0 on a match, with the
 * pieces copied out (tail "" when absent); -1 otherwise. */
static int split_model_url(const char *url, char *name, size_t nn, char *ver, size_t nv, char *tail, size_t nt)
{
    static const char pre[] = "/v2/models/";
    if (strncmp(url, pre, sizeof pre - 1)) return -1;
    const char *p = url + sizeof pre - 1, *e = strchr(p, '/');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    if (len == 0 || len >= nn) return -1;
    memcpy(name, p, len);
    name[len] = 0;
    ver[0] = tail[0] = 0;
    if (!e) return 0;
    p = e + 1;
    if (!strncmp(p, "versions/", 9)) {
        p += 9;
        e = strchr(p, '/');
        len = e ? (size_t)(e - p) : strlen(p);
        if (len == 0 || len >= nv) return -1;
        memcpy(ver, p, len);
        ver[len] = 0;
        if (!e) return 0;
        p = e + 1;
    }
    if (strlen(p) >= nt || strchr(p, '/')) return -1;
    snprintf(tail, nt, "%s", p);
    return 0;
}

static enum MHD_Result do_infer_active(server *s, struct MHD_Connection *c, ems_model *m, req_ctx *rc);

static enum MHD_Result do_infer(server *s, struct MHD_Connection *c, ems_model *m, req_ctx *rc)
{
    active_begin(s);
    enum MHD_Result r = do_infer_active(s, c, m, rc);
    active_end(s);
    return r;
}

static enum MHD_Result do_infer_active(server *s, struct MHD_Connection *c, ems_model *m, req_ctx *rc)
{
    char err[1024];
    if (atomic_load(&s->draining)) {
        pthread_mutex_lock(&m->mu);
        m->n_overload++;
        pthread_mutex_unlock(&m->mu);
        return send_error(s, c, 503, "the server is shutting down: no new requests");
    }
    const char *hl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Inference-Header-Content-Length");
    int64_t header_len = -1;
    if (hl) {
        char *end;
        errno = 0;
        long long v = strtoll(hl, &end, 10);
        if (!*hl || *end || errno || v < 0 || (size_t)v > rc->n) {
            snprintf(err, sizeof err, "bad Inference-Header-Content-Length '%.40s': must be 0 to the body's %zu bytes", hl, rc->n);
            pthread_mutex_lock(&m->mu);
            m->n_bad++;
            pthread_mutex_unlock(&m->mu);
            return send_error(s, c, 400, err);
        }
        header_len = v;
    }
    size_t json_len = header_len >= 0 ? (size_t)header_len : rc->n, jl = model_json_limit(m);
    if (json_len > jl) {
        snprintf(err, sizeof err, "the request's JSON is %zu bytes, more than a request of model '%s' can need (%zu: max_batch_size %lld rows); "
                 "send large tensors as binary data", json_len, m->name, jl, (long long)m->cfg.max_batch_size);
        pthread_mutex_lock(&m->mu);
        m->n_bad++;
        pthread_mutex_unlock(&m->mu);
        return send_error(s, c, 413, err);
    }
    ems_request req;
    if (ems_request_decode(rc->body ? rc->body : "", rc->n, header_len, &s->o->limits, &req, err, sizeof err) != 0) {
        pthread_mutex_lock(&m->mu);
        m->n_bad++;
        pthread_mutex_unlock(&m->mu);
        return send_error(s, c, 400, err);
    }
    ems_job job;
    int st = ems_job_from_request(m, &req, &job, err, sizeof err);
    if (st != 0) {
        pthread_mutex_lock(&m->mu);
        if (st == 400) m->n_bad++;
        else m->n_error++;
        pthread_mutex_unlock(&m->mu);
        ems_job_free(&job);
        ems_request_free(&req);
        return send_error(s, c, (unsigned)st, err);
    }
    ems_model_run(m, &job);
    enum MHD_Result ret;
    if (job.http_status != 200) {
        ret = send_error(s, c, (unsigned)job.http_status, job.err);
    } else {
        ems_tensor t[EMS_MAX_OUTPUTS];
        ems_response_output outs[EMS_MAX_OUTPUTS];
        int no = 0;
        for (int o = 0; o < (m->kind == EMS_KIND_GPT ? 1 : 2); o++) {
            const char *nm = o ? "probabilities" : "logits";
            int want = -2; /* -2 not asked */
            if (req.noutputs == 0) want = -1;
            for (int i = 0; i < req.noutputs; i++)
                if (!strcmp(req.outputs[i].name, nm)) want = req.outputs[i].binary;
            if (want == -2) continue;
            memset(&t[no], 0, sizeof t[no]);
            snprintf(t[no].name, sizeof t[no].name, "%s", nm);
            t[no].dtype = EMS_FP32;
            t[no].ndim = 2;
            t[no].shape[0] = job.rows;
            t[no].shape[1] = job.out_cols;
            t[no].numel = job.rows * job.out_cols;
            t[no].data = job.out[o];
            t[no].nbytes = (size_t)t[no].numel * sizeof(float);
            outs[no].tensor = &t[no];
            outs[no].binary = want == -1 ? req.binary_data_output : want == 1;
            no++;
        }
        size_t len;
        int64_t hlen;
        char *body = ems_response_encode(m->name, m->version_str, req.has_id ? req.id : NULL, outs, no, &len, &hlen);
        if (!body) ret = send_error(s, c, 500, "out of memory encoding the response");
        else ret = send_buf(s, c, 200, body, len, hlen >= 0 ? "application/octet-stream" : "application/json", hlen);
        atomic_fetch_add(&s->served, 1);
    }
    if (s->o->verbose)
        fprintf(stderr, "ember serve: infer %s/%s rows %lld -> %d (queue %.3f ms, compute %.3f ms)\n", m->name, m->version_str,
                (long long)job.rows, job.http_status, 1e3 * job.queue_s, 1e3 * job.compute_s);
    ems_job_free(&job);
    ems_request_free(&req);
    return ret;
}

static void count_bad(ems_model *m)
{
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    m->n_bad++;
    pthread_mutex_unlock(&m->mu);
}

static enum MHD_Result count_content_length(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    (void)kind;
    (void)value;
    if (key && !strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH)) ++*(int *)cls;
    return MHD_YES;
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url, const char *method, const char *version,
                               const char *upload_data, size_t *upload_data_size, void **con_cls)
{
    (void)version;
    server *s = cls;
    req_ctx *rc = *con_cls;
    if (!rc) { /* the headers have arrived */
        rc = calloc(1, sizeof *rc);
        if (!rc) return MHD_NO;
        *con_cls = rc;
        rc->limit = s->o->max_body_bytes;
        char name[EMS_NAME_MAX], ver[32], tail[32];
        ems_model *im = NULL; /* the model of an infer request */
        if (split_model_url(url, name, sizeof name, ver, sizeof ver, tail, sizeof tail) == 0 && !strcmp(tail, "infer")) {
            im = find_model(s, name, ver[0] ? ver : NULL);
            if (im && model_body_limit(im) < rc->limit) rc->limit = model_body_limit(im);
        }
        int ncl = 0;
        const char *cl = NULL;
        MHD_get_connection_values(c, MHD_HEADER_KIND, count_content_length, &ncl);
        if (ncl > 1 || (ncl == 1 && MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING))) {
            rc->answered = true; /* request smuggling: answered now, the connection closes */
            count_bad(im);
            return send_error(s, c, 400, ncl > 1 ? "more than one Content-Length header" : "both Content-Length and Transfer-Encoding");
        }
        cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl) {
            char *end;
            errno = 0;
            unsigned long long v = strtoull(cl, &end, 10);
            /* Too large: answered before the body is read when the client waits
             * for that (Expect: 100-continue, so it never sends the body) or
             * the length is absurd; otherwise the body is read and dropped and
             * the answer comes after it, as a client that is still sending
             * could lose an early answer to the connection's reset. */
            bool expect = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_EXPECT) != NULL;
            if (errno || *end || (v > rc->limit && (expect || v / 16 > rc->limit))) {
                char msg[256];
                rc->answered = true; /* the connection closes after it */
                count_bad(im);
                snprintf(msg, sizeof msg, "the request body (Content-Length %.30s) is larger than the %zu bytes this endpoint takes%s", cl, rc->limit,
                         rc->limit == s->o->max_body_bytes ? " (ember serve --max-body-mb)" : "");
                return send_error(s, c, 413, msg);
            }
            if (v > rc->limit) rc->too_big = true;
        }
        const char *ce = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_ENCODING);
        if (ce && strcasecmp(ce, "identity")) rc->bad_encoding = 1;
        return MHD_YES;
    }
    if (rc->answered) { /* a response is queued already: what still comes is dropped */
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (*upload_data_size > 0) {
        size_t add = *upload_data_size;
        *upload_data_size = 0;
        if (rc->too_big || rc->over_budget || rc->n + add > rc->limit) {
            rc->too_big = rc->too_big || !rc->over_budget; /* the rest is read and dropped; the answer is 413 (503 over the budget) */
            atomic_fetch_sub(&s->buffered, rc->cap);
            free(rc->body);
            rc->body = NULL;
            rc->n = rc->cap = 0;
            return MHD_YES;
        }
        if (rc->n + add > rc->cap) {
            size_t nc = rc->cap ? rc->cap : 4096;
            while (nc < rc->n + add) nc *= 2;
            if (nc > rc->limit) nc = rc->limit;
            /* every connection's bodies together stay within --max-buffered-mb */
            size_t grow = nc - rc->cap, before = atomic_fetch_add(&s->buffered, grow);
            if (before + grow > s->o->max_buffered_bytes) {
                atomic_fetch_sub(&s->buffered, grow + rc->cap);
                rc->over_budget = true;
                free(rc->body);
                rc->body = NULL;
                rc->n = rc->cap = 0;
                return MHD_YES;
            }
            char *t = realloc(rc->body, nc);
            if (!t) {
                atomic_fetch_sub(&s->buffered, grow);
                return MHD_NO;
            }
            rc->body = t;
            rc->cap = nc;
        }
        memcpy(rc->body + rc->n, upload_data, add);
        rc->n += add;
        return MHD_YES;
    }
    /* the whole request is in: in flight until its response is sent */
    if (!rc->counted) {
        atomic_fetch_add(&s->in_flight, 1);
        rc->counted = true;
    }
    /* HEAD is GET without the body (libmicrohttpd drops the body of a HEAD response) */
    const bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST");
    char name[EMS_NAME_MAX], ver[32], tail[32], msg[512];
    if (!strcmp(url, "/v2/health/live")) return get ? send_empty(s, c, 200) : send_error(s, c, 405, "use GET");
    if (!strcmp(url, "/v2/health/ready")) {
        if (!get) return send_error(s, c, 405, "use GET");
        return atomic_load(&s->draining) ? send_error(s, c, 503, "the server is shutting down") : send_empty(s, c, 200);
    }
    if (!strcmp(url, "/v2") || !strcmp(url, "/v2/")) {
        if (!get) return send_error(s, c, 405, "use GET");
        json_t *j = json_object(), *ext = json_array();
        json_object_set_new(j, "name", json_string("ember"));
        json_object_set_new(j, "version", json_string(EMBER_VERSION_STRING));
        json_array_append_new(ext, json_string("binary_tensor_data"));
        json_object_set_new(j, "extensions", ext);
        return send_json(s, c, 200, j);
    }
    if (!strcmp(url, "/metrics")) {
        if (!get) return send_error(s, c, 405, "use GET");
        struct ems_buf b = {0};
        uint64_t http[6];
        for (int i = 0; i < 6; i++) http[i] = atomic_load(&s->http[i]);
        ems_metrics_write(&s->repo, &b, (int64_t)atomic_load(&s->in_flight) - 1 /* not this one */, http);
        if (b.oom) {
            free(b.p);
            return send_error(s, c, 500, "out of memory");
        }
        return send_buf(s, c, 200, b.p, b.n, "text/plain; version=0.0.4; charset=utf-8", -1);
    }
    if (split_model_url(url, name, sizeof name, ver, sizeof ver, tail, sizeof tail) == 0) {
        ems_model *m = find_model(s, name, ver[0] ? ver : NULL);
        if (!m) {
            if (model_exists(s, name)) snprintf(msg, sizeof msg, "model '%s' has no version '%s' being served", name, ver);
            else snprintf(msg, sizeof msg, "unknown model '%s'", name);
            return send_error(s, c, 404, msg);
        }
        if (!tail[0]) return get ? send_json(s, c, 200, model_metadata(s, m)) : send_error(s, c, 405, "use GET");
        if (!strcmp(tail, "ready")) {
            if (!get) return send_error(s, c, 405, "use GET");
            if (atomic_load(&s->draining)) return send_error(s, c, 503, "the server is shutting down");
            json_t *j = json_object();
            json_object_set_new(j, "name", json_string(m->name));
            json_object_set_new(j, "ready", json_true());
            return send_json(s, c, 200, j);
        }
        if (!strcmp(tail, "infer")) {
            if (!post) return send_error(s, c, 405, "use POST");
            if (rc->too_big || rc->bad_encoding || rc->over_budget) {
                pthread_mutex_lock(&m->mu);
                if (rc->over_budget) m->n_overload++;
                else m->n_bad++;
                pthread_mutex_unlock(&m->mu);
            }
            if (rc->over_budget)
                return send_error(s, c, 503, "the server holds too many request bodies at once (ember serve --max-buffered-mb); retry later");
            if (rc->too_big) {
                snprintf(msg, sizeof msg, "the request body is larger than the %zu bytes this endpoint takes%s", rc->limit,
                         rc->limit == s->o->max_body_bytes ? " (ember serve --max-body-mb)" : "");
                return send_error(s, c, 413, msg);
            }
            if (rc->bad_encoding) return send_error(s, c, 415, "compressed request bodies (Content-Encoding) are not supported");
            return do_infer(s, c, m, rc);
        }
    }
    snprintf(msg, sizeof msg, "no such endpoint: %.20s %.300s", method, url);
    return send_error(s, c, 404, msg);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    (void)c;
    (void)toe;
    server *s = cls;
    req_ctx *rc = *con_cls;
    if (!rc) return;
    if (rc->counted) atomic_fetch_sub(&s->in_flight, 1);
    atomic_fetch_sub(&s->buffered, rc->cap);
    free(rc->body);
    free(rc);
    *con_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n && line[n - 1] == '\n') line[--n] = 0;
    fprintf(stderr, "ember serve: http: %s\n", line);
}

int ems_serve(const ems_options *o)
{
    server *s = calloc(1, sizeof *s);
    if (!s) return 1;
    s->o = o;
    pthread_mutex_init(&s->idle_mu, NULL);
    pthread_cond_init(&s->idle_cv, NULL);
    int rc = 1;
    char err[1024];
    ems_instance_spec inst[EMS_MAX_INSTANCES];
    int ninst = ems_parse_instances(o->instances ? o->instances : "cpu:1,cuda:all", inst, EMS_MAX_INSTANCES, err, sizeof err);
    if (ninst < 0) {
        fprintf(stderr, "ember serve: --instances: %s\n", err);
        free(s);
        return 1;
    }
    /* again, now that the runtime is up: a library it loaded (PoCL's LLVM)
     * may have put its own SIGINT handler in place of ours */
    if (g_sig_pipe[0] >= 0) ems_signals_install();
    if (ems_repo_load(o->repository, o, inst, ninst, &s->repo) != 0) {
        free(s);
        return 1;
    }
    int early = wait_signal(0); /* a signal while the models loaded: stop now */
    if (early) {
        fprintf(stderr, "ember serve: %s while loading the models: stopping\n", early == SIGINT ? "SIGINT" : "SIGTERM");
        ems_repo_free(&s->repo);
        free(s);
        return 0;
    }
    if (o->benchmark_s > 0) {
        rc = 0;
        for (int i = 0; i < s->repo.n; i++)
            if (ems_model_benchmark(s->repo.models[i], o->benchmark_s, stdout) != 0) rc = 1;
        goto out;
    }
    /* the listening address */
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    const char *host = o->host ? o->host : "127.0.0.1";
    if (!strcmp(host, "localhost")) host = "127.0.0.1";
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC | MHD_USE_ERROR_LOG;
    struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)o->port);
    } else if (inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)o->port);
        flags |= MHD_USE_IPv6;
    } else {
        fprintf(stderr, "ember serve: --host '%s' is not an IPv4 or IPv6 address\n", host);
        goto out;
    }
    s->d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, handler, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
                            MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                            MHD_OPTION_CONNECTION_LIMIT, o->connection_limit, MHD_OPTION_PER_IP_CONNECTION_LIMIT, o->per_ip_limit, MHD_OPTION_CONNECTION_TIMEOUT, o->idle_timeout_s ? o->idle_timeout_s : 30u,
                            MHD_OPTION_NOTIFY_COMPLETED, completed, s, MHD_OPTION_END);
    if (!s->d) {
        fprintf(stderr, "ember serve: cannot listen on %s port %d: %s\n", host, o->port,
                errno ? strerror(errno) : "libmicrohttpd could not start");
        goto out;
    }
    int port = o->port;
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_LISTEN_FD);
    if (di) {
        struct sockaddr_storage b;
        socklen_t bl = sizeof b;
        if (getsockname(di->listen_fd, (struct sockaddr *)&b, &bl) == 0)
            port = ntohs(b.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&b)->sin6_port : ((struct sockaddr_in *)&b)->sin_port);
    }
    for (int i = 0; i < s->repo.n; i++) {
        ems_model *m = s->repo.models[i];
        char sh[160], devs[512];
        size_t w = (size_t)snprintf(sh, sizeof sh, "[-1");
        for (int k = 0; k < m->ndim && w < sizeof sh; k++) w += (size_t)snprintf(sh + w, sizeof sh - w, ", %lld", (long long)m->dims[k]);
        if (w < sizeof sh) snprintf(sh + w, sizeof sh - w, "]");
        w = 0;
        devs[0] = 0;
        for (int k = 0; k < m->ninstances && w < sizeof devs; k++)
            w += (size_t)snprintf(devs + w, sizeof devs - w, "%s%s", k ? ", " : "", m->inst[k].device_name);
        fprintf(stderr, "ember serve: model '%s' version %s: %s; input '%s' %s %s -> %s [-1, %lld]; max_batch_size %lld, "
                        "max_queue_delay %lld us, max_queue_size %lld; instances %s\n",
                m->name, m->version_str, m->kind == EMS_KIND_GPT ? "GPT" : m->onnx ? "ONNX classifier" : "classifier", m->cfg.input_name,
                ems_dtype_name(m->cfg.input_dtype), sh, m->kind == EMS_KIND_GPT ? "logits" : "logits, probabilities",
                (long long)m->out_cols, (long long)m->cfg.max_batch_size, (long long)m->cfg.max_queue_delay_us,
                (long long)m->cfg.max_queue_size, devs);
    }
    int nnames = 0;
    for (int i = 0; i < s->repo.n; i++) {
        bool seen = false;
        for (int k = 0; k < i && !seen; k++) seen = !strcmp(s->repo.models[k]->name, s->repo.models[i]->name);
        nnames += !seen;
    }
    char vers[48] = "";
    if (nnames != s->repo.n) snprintf(vers, sizeof vers, ", %d versions", s->repo.n);
    fprintf(stderr, "ember serve: listening on http://%s%s%s:%d (%d model%s%s; SIGTERM or Ctrl-C drains and stops)\n",
            strchr(host, ':') ? "[" : "", host, strchr(host, ':') ? "]" : "", port, nnames, nnames == 1 ? "" : "s", vers);
    fflush(stderr);

    s->last_active = ems_now();
    s->idle_started = pthread_create(&s->idle_thread, NULL, idle_main, s) == 0;
    int sig = 0;
    while (!(sig = wait_signal(-1))) {
    }
    atomic_store(&s->draining, 1);
    MHD_socket lfd = MHD_quiesce_daemon(s->d);
    if (lfd != MHD_INVALID_SOCKET) close(lfd);
    fprintf(stderr, "ember serve: %s: not accepting connections; finishing %lld in-flight request(s)\n", sig == SIGINT ? "SIGINT" : "SIGTERM",
            (long long)atomic_load(&s->in_flight));
    fflush(stderr);
    ems_repo_flush(&s->repo); /* queued requests go now, not after their queue delay */
    double t0 = ems_now(), idle_since = 0;
    /* until nothing has been in flight for EMS_DRAIN_GRACE_S: a request that
     * a keep-alive client sent just before the drain still gets its answer */
    for (;;) {
        double now = ems_now();
        if (atomic_load(&s->in_flight) > 0) idle_since = 0;
        else if (idle_since == 0) idle_since = now;
        else if (now - idle_since >= EMS_DRAIN_GRACE_S) break;
        if (ems_now() - t0 > o->drain_timeout_s) {
            /* requests still computing or waiting: their threads cannot be
             * stopped cleanly, so the process ends here */
            fprintf(stderr, "ember serve: the drain timed out after %g s with %lld request(s) in flight: exiting without them\n",
                    o->drain_timeout_s, (long long)atomic_load(&s->in_flight));
            fflush(stderr);
            _exit(1);
        }
        int s2 = wait_signal(10);
        if (s2 > 0) {
            fprintf(stderr, "ember serve: a second signal: stopping at once\n");
            _exit(128 + s2);
        }
    }
    MHD_stop_daemon(s->d);
    s->d = NULL;
    fprintf(stderr, "ember serve: stopped after %llu inference response(s)\n", (unsigned long long)atomic_load(&s->served));
    rc = 0;
out:
    if (s->d) MHD_stop_daemon(s->d);
    if (s->idle_started) { /* the workers run again before the models are freed and StarPU stops */
        pthread_mutex_lock(&s->idle_mu);
        s->idle_stop = true;
        pthread_cond_signal(&s->idle_cv);
        pthread_mutex_unlock(&s->idle_mu);
        pthread_join(s->idle_thread, NULL);
    }
    ems_repo_free(&s->repo);
    pthread_mutex_destroy(&s->idle_mu);
    pthread_cond_destroy(&s->idle_cv);
    free(s);
    return rc;
}
