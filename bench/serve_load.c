/* serve_load: a self-contained HTTP/1.1 load generator for `ember serve` (KServe v2 infer requests), for machines
 * without wrk or network. C11 + pthreads + libc only; it does not link Ember.
 *
 *   serve_load --url http://HOST:PORT/PATH [--body FILE] [--header 'Name: value']... [--connections 1,4,16,64]
 *              (--duration SECONDS | --requests N) [--warmup SECONDS] [--expect-status 200] [--pid PID]
 *              [--csv FILE] [--timeout-ms MS] [--rate R]
 *
 * One thread per connection; each keeps one keep-alive connection (reconnecting when the server closes it) and sends
 * requests back to back: POST with the body file when --body is given, GET otherwise. A request's latency runs from
 * its first byte sent to the last byte of its response received (CLOCK_MONOTONIC). Responses are parsed: status line,
 * headers, a Content-Length or chunked body, `Connection: close`. The concurrency levels run one after another, each on
 * fresh connections, after --warmup seconds that are not counted. Per level it prints
 *
 *   connections 16: 12345 requests in 10.00 s = 1234.5 req/s; latency ms p50 1.23 p95 2.34 p99 3.45 max 9.87; errors 0
 *   (status: 200=12345)
 *
 * (one line) with exact percentiles of all recorded latencies. Responses with a status other than --expect-status,
 * socket errors, malformed responses and requests past --timeout-ms (default 30000) are errors. With --requests N, N is
 * the total over the connections. --pid samples the server's VmRSS once per second and prints `rss KiB first X last Y
 * max Z`; --csv appends connections,requests,seconds,rps,p50_ms,p95_ms,p99_ms,max_ms,errors per level (a header line
 * first when the file is new), with a last column rate (the offered --rate, 0 for closed-loop rows). Exit status: 0
 * without errors, 1 with any, 2 on usage errors.
 *
 * Open loop (--rate R, requests per second in total, R > 0): instead of back to back, requests are sent on a fixed
 * schedule t0 + i/R, i = 0, 1, 2, ..., whatever the server does. The connections share one atomic counter: a connection
 * that is free claims the next i, sleeps until t0 + i/R (clock_nanosleep, CLOCK_MONOTONIC, absolute time) and sends, or
 * sends at once when that time has passed (all connections were busy: the server is slower than R). A request's latency
 * then runs from its SCHEDULED time, not from its actual send, so an overloaded server shows as growing latency and an
 * achieved rate below the offered one, not as a quietly lower rate (no coordinated omission). At most --connections
 * requests are in flight; each level still runs in turn on its own connections. Before t0 every connection of the level
 * is opened (so the first requests do not pay connect time; a reconnect during the run does count in latency). With
 * --duration D the requests scheduled in [t0', t0' + D) are sent (t0' = start of measuring) and the level lasts until
 * the last of them is answered (or times out); with --requests N exactly N are scheduled. --warmup W is open loop too,
 * at the same rate and on the same schedule: the requests scheduled in [t0, t0 + W) are sent but not counted, and
 * measuring starts at the first schedule slot at or after t0 + W, so the server's queue carries over. The per-level line
 * reads `connections 16 rate 500.0/s: 2500 requests in 5.00 s = 499.8 req/s; ...`: offered rate, then the answered
 * requests over the time from the first measured slot to the last measured answer (the achieved rate; with --duration
 * at least D). --timeout-ms still bounds each request's own I/O, from its actual send. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <math.h>

#define MAX_LEVELS 64
#define MAX_HEADERS 64
#define MAX_HEAD_BYTES (1 << 20)

/* Phases of one level, set by the main thread. */
enum { PHASE_WARMUP, PHASE_MEASURE, PHASE_STOP };

/* Outcomes of one request attempt. */
enum { RES_OK, RES_SOCKET, RES_TIMEOUT, RES_BAD, RES_STALE };

static struct {
    char host[256], port[16], hostport[300];
    const char *path;
    char *body;
    size_t body_len;
    const char *headers[MAX_HEADERS];
    int n_headers;
    int levels[MAX_LEVELS], n_levels;
    double duration, warmup;
    long long requests;
    int expect_status;
    long pid;
    const char *csv;
    int timeout_ms;
    struct addrinfo *addr;
    char *request;
    size_t request_len;
    double rate;               /* --rate: offered requests per second in total; 0 = closed loop */
} cfg;

static atomic_int phase;
static atomic_llong tickets;   /* --requests: requests claimed in the measured phase */
static atomic_int threads_done;
static double t_measure;       /* start of the measured phase, seconds */

/* --rate (open loop): request i of a level is scheduled at rate_t0 + i / cfg.rate; tickets hands out i. Requests
 * i < rate_warm are the warm-up, rate_warm <= i < rate_warm + rate_n are measured. */
static double rate_t0;
static long long rate_warm, rate_n;
static pthread_barrier_t rate_start;

typedef struct {
    double *lat;               /* latencies in ms of the measured responses */
    size_t n_lat, cap_lat;
    long long status[600], other_status;
    long long sock_err, timeouts, bad;
    double last_end;           /* completion time of the last measured request */
    char *buf;
    size_t cap, len, pos;
    int fd;
} worker;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "serve_load: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (see --help)\n");
    va_end(ap);
    exit(2);
}

static void print_help(void)
{
    printf("usage: serve_load --url http://HOST:PORT/PATH [options] (--duration SECONDS | --requests N)\n"
           "\n"
           "HTTP/1.1 load generator: one thread and one keep-alive connection per connection, requests back to back\n"
           "(closed loop), or on a fixed schedule with --rate (open loop).\n"
           "\n"
           "  --url URL              http://HOST[:PORT]/PATH (required)\n"
           "  --body FILE            POST this file as the body (GET without it)\n"
           "  --header 'Name: value' extra request header (repeatable)\n"
           "  --connections LIST     comma-separated concurrency levels, run one after another (default 1)\n"
           "  --duration SECONDS     measured time per level\n"
           "  --requests N           measured requests per level, in total over the connections\n"
           "  --warmup SECONDS       unmeasured time per level before measuring (default 0)\n"
           "  --expect-status CODE   the status that is not an error (default 200)\n"
           "  --pid PID              sample the server's VmRSS once per second; print first / last / max per level\n"
           "  --csv FILE             append connections,requests,seconds,rps,p50_ms,p95_ms,p99_ms,max_ms,errors,rate\n"
           "                         rows (rate: the offered --rate, 0 for closed loop)\n"
           "  --timeout-ms MS        per-request timeout, counted as an error (default 30000)\n"
           "  --rate R               open loop: send R requests/s in total on a fixed schedule t0 + i/R shared by the\n"
           "                         connections (a free connection takes the next slot, sleeps until it, or sends at\n"
           "                         once when late); latency from the scheduled time; --warmup is open loop too\n"
           "  --help                 this text\n"
           "\n"
           "Latency: first byte sent to last byte received (CLOCK_MONOTONIC); with --rate, scheduled send time to last\n"
           "byte received. Percentiles are exact (nearest rank).\n"
           "Exit status: 0 no errors, 1 some error (unexpected status, socket error, timeout, bad response), 2 usage.\n");
}

static double parse_num(const char *opt, const char *s, double lo)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo))
        usage_error("bad value '%s' for %s", s, opt);
    return v;
}

static void parse_url(const char *url)
{
    if (strncmp(url, "http://", 7))
        usage_error("--url must start with http:// (got '%s')", url);
    const char *h = url + 7, *slash = strchr(h, '/');
    size_t hl = slash ? (size_t)(slash - h) : strlen(h);
    cfg.path = slash ? slash : "/";
    if (hl == 0 || hl >= sizeof cfg.host)
        usage_error("bad host in --url '%s'", url);
    char hp[256];
    memcpy(hp, h, hl);
    hp[hl] = 0;
    snprintf(cfg.hostport, sizeof cfg.hostport, "%s", hp);
    char *colon;
    if (hp[0] == '[') {
        char *rb = strchr(hp, ']');
        if (!rb)
            usage_error("bad IPv6 host in --url '%s'", url);
        *rb = 0;
        snprintf(cfg.host, sizeof cfg.host, "%s", hp + 1);
        colon = rb[1] == ':' ? rb + 1 : NULL;
    } else {
        colon = strrchr(hp, ':');
        if (colon)
            *colon = 0;
        snprintf(cfg.host, sizeof cfg.host, "%s", hp);
    }
    if (colon) {
        if (!colon[1] || strlen(colon + 1) >= sizeof cfg.port || strspn(colon + 1, "0123456789") != strlen(colon + 1))
            usage_error("bad port in --url '%s'", url);
        snprintf(cfg.port, sizeof cfg.port, "%s", colon + 1);
    } else {
        snprintf(cfg.port, sizeof cfg.port, "80");
    }
}

static void parse_levels(const char *s)
{
    const char *p = s;
    cfg.n_levels = 0;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < 1 || v > 4096 || (*end && *end != ','))
            usage_error("bad --connections list '%s' (comma-separated counts 1..4096)", s);
        if (cfg.n_levels == MAX_LEVELS)
            usage_error("too many levels in --connections (at most %d)", MAX_LEVELS);
        cfg.levels[cfg.n_levels++] = (int)v;
        p = *end ? end + 1 : end;
    }
    if (cfg.n_levels == 0)
        usage_error("empty --connections list");
}

static void read_body(const char *file)
{
    FILE *f = fopen(file, "rb");
    if (!f)
        usage_error("cannot open --body file '%s': %s", file, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);
    for (;;) {
        if (n == cap)
            b = realloc(b, cap *= 2);
        if (!b) {
            fprintf(stderr, "serve_load: out of memory\n");
            exit(2);
        }
        size_t r = fread(b + n, 1, cap - n, f);
        if (r == 0)
            break;
        n += r;
    }
    if (ferror(f))
        usage_error("cannot read --body file '%s'", file);
    fclose(f);
    cfg.body = b;
    cfg.body_len = n;
}

static long read_rss_kib(long pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%ld/status", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    long kib = -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6)) {
            kib = strtol(line + 6, NULL, 10);
            break;
        }
    fclose(f);
    return kib;
}

/* --rate: the number of schedule slots i >= 0 with i / rate < secs. */
static long long slots_before(double secs)
{
    double x = secs * cfg.rate;
    if (x > 1e15)
        usage_error("--rate %g over %g s schedules too many requests", cfg.rate, secs);
    long long n = (long long)x;
    while (n > 0 && (double)(n - 1) / cfg.rate >= secs)
        n--;
    while ((double)n / cfg.rate < secs)
        n++;
    return n;
}

static void parse_args(int argc, char **argv)
{
    const char *url = NULL, *body = NULL, *conns = "1";
    int have_duration = 0, have_requests = 0;
    cfg.expect_status = 200;
    cfg.timeout_ms = 30000;
    cfg.pid = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            print_help();
            exit(0);
        }
        if (strncmp(a, "--", 2))
            usage_error("unexpected argument '%s'", a);
        char name[64];
        const char *eq = strchr(a, '=');
        size_t nl = eq ? (size_t)(eq - a) : strlen(a);
        if (nl >= sizeof name)
            usage_error("unknown option '%s'", a);
        memcpy(name, a, nl);
        name[nl] = 0;
        static const char *known[] = {"--url", "--body", "--header", "--connections", "--duration", "--requests",
                                      "--warmup", "--expect-status", "--pid", "--csv", "--timeout-ms", "--rate"};
        int k = -1;
        for (int j = 0; j < (int)(sizeof known / sizeof *known); j++)
            if (!strcmp(name, known[j]))
                k = j;
        if (k < 0)
            usage_error("unknown option '%s'", name);
        if (eq)
            v = eq + 1;
        else if (i + 1 < argc)
            v = argv[++i];
        else
            usage_error("option %s needs a value", name);
        switch (k) {
        case 0: url = v; break;
        case 1: body = v; break;
        case 2:
            if (cfg.n_headers == MAX_HEADERS)
                usage_error("too many --header options (at most %d)", MAX_HEADERS);
            if (!strchr(v, ':') || strpbrk(v, "\r\n"))
                usage_error("bad --header '%s' (want 'Name: value')", v);
            cfg.headers[cfg.n_headers++] = v;
            break;
        case 3: conns = v; break;
        case 4: cfg.duration = parse_num(name, v, 0.001); have_duration = 1; break;
        case 5: cfg.requests = (long long)parse_num(name, v, 1); have_requests = 1; break;
        case 6: cfg.warmup = parse_num(name, v, 0); break;
        case 7:
            cfg.expect_status = (int)parse_num(name, v, 100);
            if (cfg.expect_status > 599)
                usage_error("bad value '%s' for %s", v, name);
            break;
        case 8: cfg.pid = (long)parse_num(name, v, 1); break;
        case 9: cfg.csv = v; break;
        case 10: cfg.timeout_ms = (int)parse_num(name, v, 1); break;
        case 11:
            cfg.rate = parse_num(name, v, 0);
            if (!(cfg.rate > 0) || !isfinite(cfg.rate))
                usage_error("bad value '%s' for %s (want requests per second > 0)", v, name);
            break;
        }
    }
    if (!url)
        usage_error("--url is required");
    if (have_duration == have_requests)
        usage_error("give exactly one of --duration and --requests");
    parse_url(url);
    parse_levels(conns);
    if (body)
        read_body(body);
    if (cfg.pid > 0 && read_rss_kib(cfg.pid) < 0)
        usage_error("--pid %ld: cannot read VmRSS from /proc/%ld/status", cfg.pid, cfg.pid);
    if (cfg.rate > 0) {
        rate_warm = cfg.warmup > 0 ? slots_before(cfg.warmup) : 0;
        rate_n = have_requests ? cfg.requests : slots_before(cfg.duration);
        if (rate_n < 1)
            usage_error("--rate %g with --duration %g schedules no request", cfg.rate, cfg.duration);
    }
}

static void build_request(void)
{
    size_t cap = 1024 + strlen(cfg.path) + cfg.body_len;
    for (int i = 0; i < cfg.n_headers; i++)
        cap += strlen(cfg.headers[i]) + 2;
    char *r = malloc(cap);
    if (!r) {
        fprintf(stderr, "serve_load: out of memory\n");
        exit(2);
    }
    int n = snprintf(r, cap, "%s %s HTTP/1.1\r\nHost: %s\r\n", cfg.body ? "POST" : "GET", cfg.path, cfg.hostport);
    if (cfg.body)
        n += snprintf(r + n, cap - n, "Content-Length: %zu\r\n", cfg.body_len);
    for (int i = 0; i < cfg.n_headers; i++)
        n += snprintf(r + n, cap - n, "%s\r\n", cfg.headers[i]);
    n += snprintf(r + n, cap - n, "\r\n");
    if (cfg.body)
        memcpy(r + n, cfg.body, cfg.body_len);
    cfg.request = r;
    cfg.request_len = (size_t)n + cfg.body_len;
}

/* Milliseconds left until deadline (at least 0). */
static int ms_left(double deadline)
{
    double l = (deadline - now_s()) * 1e3;
    return l <= 0 ? 0 : l > 1e9 ? 1000000000 : (int)l + 1;
}

static void close_conn(worker *w)
{
    if (w->fd >= 0)
        close(w->fd);
    w->fd = -1;
    w->len = w->pos = 0;
}

/* A non-blocking TCP connection to cfg.addr within the deadline; 0 on success. */
static int open_conn(worker *w, double deadline)
{
    close_conn(w);
    for (struct addrinfo *ai = cfg.addr; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0)
            continue;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
            if (errno != EINPROGRESS) {
                close(fd);
                continue;
            }
            struct pollfd p = {fd, POLLOUT, 0};
            int err = 0;
            socklen_t el = sizeof err;
            if (poll(&p, 1, ms_left(deadline)) != 1 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) < 0 || err) {
                close(fd);
                continue;
            }
        }
        w->fd = fd;
        return 0;
    }
    return -1;
}

/* Reads more bytes into w->buf: 1 when some arrived, 0 at end of stream, RES_SOCKET or RES_TIMEOUT (negated). */
static int fill(worker *w, double deadline)
{
    if (w->pos == w->len)
        w->pos = w->len = 0;
    if (w->len == w->cap && w->pos > 0) {
        memmove(w->buf, w->buf + w->pos, w->len - w->pos);
        w->len -= w->pos;
        w->pos = 0;
    }
    if (w->len == w->cap) {
        if (w->cap >= MAX_HEAD_BYTES)
            return -RES_BAD;
        char *nb = realloc(w->buf, w->cap * 2);
        if (!nb)
            return -RES_SOCKET;
        w->buf = nb;
        w->cap *= 2;
    }
    for (;;) {
        ssize_t r = recv(w->fd, w->buf + w->len, w->cap - w->len, 0);
        if (r > 0) {
            w->len += (size_t)r;
            return 1;
        }
        if (r == 0)
            return 0;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return -RES_SOCKET;
        struct pollfd p = {w->fd, POLLIN, 0};
        int ms = ms_left(deadline);
        if (ms == 0)
            return -RES_TIMEOUT;
        int pr = poll(&p, 1, ms);
        if (pr == 0)
            return -RES_TIMEOUT;
        if (pr < 0 && errno != EINTR)
            return -RES_SOCKET;
    }
}

/* Discards n body bytes. */
static int skip_bytes(worker *w, unsigned long long n, double deadline)
{
    while (n > 0) {
        size_t avail = w->len - w->pos;
        if (avail == 0) {
            w->pos = w->len = 0;
            int f = fill(w, deadline);
            if (f <= 0)
                return f == 0 ? -RES_SOCKET : f;
            continue;
        }
        size_t take = avail < n ? avail : (size_t)n;
        w->pos += take;
        n -= take;
    }
    return 0;
}

/* Finds "\r\n" (line) or "\r\n\r\n" (head) from w->pos, reading as needed; returns the offset past it, or < 0. */
static long find_delim(worker *w, const char *delim, double deadline, int *got_bytes)
{
    size_t dl = strlen(delim), from = w->pos;
    for (;;) {
        if (w->len - w->pos > 0)
            *got_bytes = 1;
        if (w->len >= from + dl) {
            char *hit = memmem(w->buf + from, w->len - from, delim, dl);
            if (hit)
                return (long)(hit - w->buf) + (long)dl;
            from = w->len - (dl - 1);
        }
        size_t old_pos = w->pos;
        int f = fill(w, deadline);
        if (f <= 0)
            return f == 0 ? -RES_SOCKET : f;
        from -= old_pos - w->pos;  /* fill may have moved the unread bytes to the front */
    }
}

static int header_is(const char *line, size_t len, const char *name, const char **value, size_t *vlen)
{
    size_t nl = strlen(name);
    if (len <= nl || strncasecmp(line, name, nl) || line[nl] != ':')
        return 0;
    const char *v = line + nl + 1, *e = line + len;
    while (v < e && (*v == ' ' || *v == '\t'))
        v++;
    while (e > v && (e[-1] == ' ' || e[-1] == '\t'))
        e--;
    *value = v;
    *vlen = (size_t)(e - v);
    return 1;
}

static int contains_token(const char *v, size_t n, const char *tok)
{
    size_t tl = strlen(tok);
    for (size_t i = 0; i + tl <= n; i++)
        if (!strncasecmp(v + i, tok, tl))
            return 1;
    return 0;
}

/* Reads one whole response: its status in *status, whether the connection must close in *close_after. On failure
 * returns RES_STALE when nothing at all arrived before the connection ended (a keep-alive connection the server closed). */
static int read_response(worker *w, double deadline, int *status, int *close_after)
{
    int got = 0;
    for (;;) {
        long end = find_delim(w, "\r\n\r\n", deadline, &got);
        if (end < 0)
            return (end == -RES_SOCKET && !got) ? RES_STALE : (int)-end;
        char *h = w->buf + w->pos;
        size_t hlen = (size_t)end - w->pos;
        w->pos = (size_t)end;
        int minor, code;
        if (hlen < 12 || sscanf(h, "HTTP/1.%d %3d", &minor, &code) != 2 || code < 100 || code > 599)
            return RES_BAD;
        int chunked = 0, conn_close = minor == 0, conn_keep = 0;
        long long clen = -1;
        char *line = memchr(h, '\n', hlen) + 1;
        while (line < h + hlen - 2) {
            char *nl = memchr(line, '\n', (size_t)(h + hlen - line));
            size_t ll = (size_t)(nl - line) - (nl > line && nl[-1] == '\r');
            const char *v;
            size_t vl;
            if (header_is(line, ll, "Content-Length", &v, &vl)) {
                char tmp[32];
                if (vl == 0 || vl >= sizeof tmp || strspn(v, "0123456789") < vl)
                    return RES_BAD;
                memcpy(tmp, v, vl);
                tmp[vl] = 0;
                clen = strtoll(tmp, NULL, 10);
            } else if (header_is(line, ll, "Transfer-Encoding", &v, &vl)) {
                chunked = contains_token(v, vl, "chunked");
            } else if (header_is(line, ll, "Connection", &v, &vl)) {
                if (contains_token(v, vl, "close"))
                    conn_close = 1;
                if (contains_token(v, vl, "keep-alive"))
                    conn_keep = 1;
            }
            line = nl + 1;
        }
        if (minor == 0 && conn_keep)
            conn_close = 0;
        if (code < 200) /* an interim response (100 Continue): the real one follows */
            continue;
        *status = code;
        *close_after = conn_close;
        if (code == 204 || code == 304)
            return RES_OK;
        if (chunked) {
            for (;;) {
                long le = find_delim(w, "\r\n", deadline, &got);
                if (le < 0)
                    return (int)-le;
                char *s = w->buf + w->pos, *e;
                unsigned long long sz = strtoull(s, &e, 16);
                if (e == s || (*e != ';' && *e != '\r' && *e != ' ' && *e != '\t'))
                    return RES_BAD;
                w->pos = (size_t)le;
                if (sz == 0)
                    break;
                int r = skip_bytes(w, sz, deadline);
                if (r < 0)
                    return -r;
                le = find_delim(w, "\r\n", deadline, &got);
                if (le < 0)
                    return (int)-le;
                if ((size_t)le != w->pos + 2)
                    return RES_BAD;
                w->pos = (size_t)le;
            }
            for (;;) { /* trailers up to the empty line */
                long le = find_delim(w, "\r\n", deadline, &got);
                if (le < 0)
                    return (int)-le;
                int empty = (size_t)le == w->pos + 2;
                w->pos = (size_t)le;
                if (empty)
                    return RES_OK;
            }
        }
        if (clen >= 0) {
            int r = skip_bytes(w, (unsigned long long)clen, deadline);
            return r < 0 ? -r : RES_OK;
        }
        /* No length: the body runs to the end of the connection. */
        *close_after = 1;
        for (;;) {
            w->pos = w->len = 0;
            int f = fill(w, deadline);
            if (f == 0)
                return RES_OK;
            if (f < 0)
                return -f;
        }
    }
}

/* Sends the whole request; 0, or RES_SOCKET / RES_TIMEOUT / RES_STALE (EPIPE / reset on a reused connection). */
static int send_request(worker *w, double deadline)
{
    size_t off = 0;
    while (off < cfg.request_len) {
        ssize_t r = send(w->fd, cfg.request + off, cfg.request_len - off, MSG_NOSIGNAL);
        if (r > 0) {
            off += (size_t)r;
            continue;
        }
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd p = {w->fd, POLLOUT, 0};
            int ms = ms_left(deadline);
            if (ms == 0 || poll(&p, 1, ms) == 0)
                return RES_TIMEOUT;
            continue;
        }
        return (off == 0 && (errno == EPIPE || errno == ECONNRESET)) ? RES_STALE : RES_SOCKET;
    }
    return 0;
}

static void record(worker *w, double t0, double t1, int measured)
{
    if (!measured)
        return;
    if (w->n_lat == w->cap_lat) {
        size_t nc = w->cap_lat ? w->cap_lat * 2 : 4096;
        double *nl = realloc(w->lat, nc * sizeof *nl);
        if (!nl) {
            fprintf(stderr, "serve_load: out of memory for latencies\n");
            exit(2);
        }
        w->lat = nl;
        w->cap_lat = nc;
    }
    w->lat[w->n_lat++] = (t1 - t0) * 1e3;
    w->last_end = t1;
}

/* Sleeps until CLOCK_MONOTONIC time t (seconds, as now_s). */
static void sleep_until(double t)
{
    struct timespec ts;
    ts.tv_sec = (time_t)t;
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    if (ts.tv_nsec < 0)
        ts.tv_nsec = 0;
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    w->fd = -1;
    w->cap = 1 << 16;
    w->buf = malloc(w->cap);
    int reused = 0;
    if (cfg.rate > 0) {
        open_conn(w, now_s() + cfg.timeout_ms * 1e-3); /* on failure the first request connects again */
        pthread_barrier_wait(&rate_start);             /* every connection of the level is open */
        pthread_barrier_wait(&rate_start);             /* the main thread has set rate_t0 */
    }
    for (;;) {
        int measured;
        double sched = 0;
        if (cfg.rate > 0) {
            long long i = atomic_fetch_add(&tickets, 1);
            if (i >= rate_warm + rate_n)
                break;
            measured = i >= rate_warm;
            sched = rate_t0 + (double)i / cfg.rate;
            if (now_s() < sched)
                sleep_until(sched);
        } else {
            int ph = atomic_load(&phase);
            if (ph == PHASE_STOP)
                break;
            measured = ph == PHASE_MEASURE;
            if (measured && cfg.requests > 0 && atomic_fetch_add(&tickets, 1) >= cfg.requests)
                break;
        }
        int result = RES_OK, status = 0, close_after = 0;
        double t0 = 0, t1 = 0;
        for (int attempt = 0; attempt < 2; attempt++) {
            if (w->fd < 0) {
                if (open_conn(w, now_s() + cfg.timeout_ms * 1e-3) < 0) {
                    result = RES_SOCKET;
                    break;
                }
                reused = 0;
            }
            t0 = now_s();
            double deadline = t0 + cfg.timeout_ms * 1e-3;
            result = send_request(w, deadline);
            if (result == RES_OK)
                result = read_response(w, deadline, &status, &close_after);
            t1 = now_s();
            if (result == RES_STALE && reused) { /* the server closed an idle keep-alive connection: retry once */
                close_conn(w);
                continue;
            }
            break;
        }
        if (result == RES_STALE)
            result = RES_SOCKET;
        if (measured && t1 > w->last_end)
            w->last_end = t1;
        if (result == RES_OK) {
            record(w, cfg.rate > 0 ? sched : t0, t1, measured);
            if (measured)
                w->status[status]++;
            if (close_after)
                close_conn(w);
            else
                reused = 1;
            continue;
        }
        close_conn(w);
        if (measured) {
            if (result == RES_TIMEOUT)
                w->timeouts++;
            else if (result == RES_BAD)
                w->bad++;
            else
                w->sock_err++;
        }
        if (result == RES_SOCKET && atomic_load(&phase) != PHASE_STOP)
            usleep(10000); /* do not spin on a refused connection (open loop: the next slots are late, not skipped) */
    }
    close_conn(w);
    free(w->buf);
    atomic_fetch_add(&threads_done, 1);
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest-rank percentile of sorted v[0..n). */
static double pct(const double *v, size_t n, double p)
{
    if (n == 0)
        return 0;
    size_t k = (size_t)((p / 100.0) * (double)n + 0.999999999);
    if (k < 1)
        k = 1;
    if (k > n)
        k = n;
    return v[k - 1];
}

typedef struct {
    long first, last, max;
    double next;
} rss_state;

static void rss_sample(rss_state *r)
{
    if (cfg.pid <= 0)
        return;
    long k = read_rss_kib(cfg.pid);
    if (k < 0)
        return;
    if (r->first < 0)
        r->first = k;
    r->last = k;
    if (k > r->max)
        r->max = k;
    r->next += 1.0;
}

/* Runs one concurrency level; returns its error count. */
static long long run_level(int conns)
{
    worker *ws = calloc((size_t)conns, sizeof *ws);
    pthread_t *th = calloc((size_t)conns, sizeof *th);
    if (!ws || !th) {
        fprintf(stderr, "serve_load: out of memory\n");
        exit(2);
    }
    atomic_store(&phase, cfg.warmup > 0 ? PHASE_WARMUP : PHASE_MEASURE);
    atomic_store(&tickets, 0);
    atomic_store(&threads_done, 0);
    if (cfg.rate > 0 && pthread_barrier_init(&rate_start, NULL, (unsigned)conns + 1)) {
        fprintf(stderr, "serve_load: cannot make a barrier for %d threads\n", conns + 1);
        exit(2);
    }
    double start = now_s();
    t_measure = start;
    for (int i = 0; i < conns; i++)
        if (pthread_create(&th[i], NULL, worker_main, &ws[i])) {
            fprintf(stderr, "serve_load: cannot start thread %d of %d\n", i + 1, conns);
            exit(2);
        }
    if (cfg.rate > 0) { /* open loop: the schedule starts once every connection is open; warm-up is its first slots */
        pthread_barrier_wait(&rate_start);
        rate_t0 = now_s();
        t_measure = rate_t0 + (double)rate_warm / cfg.rate;
        pthread_barrier_wait(&rate_start);
        if (rate_warm > 0) {
            sleep_until(t_measure);
            atomic_store(&phase, PHASE_MEASURE);
        }
    } else if (cfg.warmup > 0) {
        while (now_s() < start + cfg.warmup && atomic_load(&threads_done) < conns)
            usleep(10000);
        t_measure = now_s();
        atomic_store(&phase, PHASE_MEASURE);
    }
    rss_state rss = {-1, -1, -1, t_measure};
    rss_sample(&rss);
    double stop_at = t_measure + cfg.duration;
    int until_done = cfg.requests > 0 || cfg.rate > 0; /* the workers end the level themselves */
    for (;;) {
        double t = now_s();
        if (!until_done && t >= stop_at)
            break;
        if (atomic_load(&threads_done) == conns)
            break;
        if (cfg.pid > 0 && t >= rss.next)
            rss_sample(&rss);
        double wake = !until_done && stop_at < rss.next ? stop_at : rss.next;
        double dt = wake - t;
        if (cfg.pid <= 0 && until_done)
            dt = 0.01;
        usleep(dt > 0.01 ? 10000 : dt > 0 ? (useconds_t)(dt * 1e6) + 1 : 1);
    }
    atomic_store(&phase, PHASE_STOP);
    for (int i = 0; i < conns; i++)
        pthread_join(th[i], NULL);
    if (cfg.rate > 0)
        pthread_barrier_destroy(&rate_start);
    if (cfg.pid > 0) {
        rss.next = 0;
        rss_sample(&rss);
    }

    size_t n = 0;
    long long status[600] = {0}, sock = 0, tmo = 0, bad = 0;
    double last = t_measure;
    for (int i = 0; i < conns; i++) {
        n += ws[i].n_lat;
        for (int s = 0; s < 600; s++)
            status[s] += ws[i].status[s];
        sock += ws[i].sock_err;
        tmo += ws[i].timeouts;
        bad += ws[i].bad;
        if (ws[i].last_end > last)
            last = ws[i].last_end;
    }
    double *all = malloc((n ? n : 1) * sizeof *all);
    size_t k = 0;
    for (int i = 0; i < conns; i++) {
        if (ws[i].n_lat)
            memcpy(all + k, ws[i].lat, ws[i].n_lat * sizeof *all);
        k += ws[i].n_lat;
        free(ws[i].lat);
    }
    qsort(all, n, sizeof *all, cmp_double);
    double secs = last - t_measure;
    if (cfg.requests == 0 && secs < cfg.duration)
        secs = cfg.duration;
    double rps = secs > 0 ? (double)n / secs : 0;
    double p50 = pct(all, n, 50), p95 = pct(all, n, 95), p99 = pct(all, n, 99), mx = n ? all[n - 1] : 0;
    long long errors = sock + tmo + bad;
    for (int s = 0; s < 600; s++)
        if (s != cfg.expect_status)
            errors += status[s];

    char st[4096];
    int sl = 0;
    for (int s = 0; s < 600; s++)
        if (status[s] && sl < (int)sizeof st - 64)
            sl += snprintf(st + sl, sizeof st - sl, "%s%d=%lld", sl ? " " : "", s, status[s]);
    if (sl == 0)
        sl += snprintf(st, sizeof st, "none");
    if (sock)
        sl += snprintf(st + sl, sizeof st - sl, "; socket errors %lld", sock);
    if (tmo)
        sl += snprintf(st + sl, sizeof st - sl, "; timeouts %lld", tmo);
    if (bad)
        sl += snprintf(st + sl, sizeof st - sl, "; bad responses %lld", bad);
    char rate_txt[64] = "";
    if (cfg.rate > 0)
        snprintf(rate_txt, sizeof rate_txt, cfg.rate >= 1 ? " rate %.1f/s" : " rate %.3g/s", cfg.rate);
    printf("connections %d%s: %zu requests in %.2f s = %.1f req/s; latency ms p50 %.2f p95 %.2f p99 %.2f max %.2f; "
           "errors %lld (status: %s)\n",
           conns, rate_txt, n, secs, rps, p50, p95, p99, mx, errors, st);
    if (cfg.pid > 0)
        printf("rss KiB first %ld last %ld max %ld\n", rss.first, rss.last, rss.max);
    fflush(stdout);
    if (cfg.csv) {
        struct stat sb;
        int fresh = stat(cfg.csv, &sb) != 0 || sb.st_size == 0;
        FILE *f = fopen(cfg.csv, "a");
        if (!f) {
            fprintf(stderr, "serve_load: cannot append to --csv '%s': %s\n", cfg.csv, strerror(errno));
            errors++;
        } else {
            if (fresh)
                fprintf(f, "connections,requests,seconds,rps,p50_ms,p95_ms,p99_ms,max_ms,errors,rate\n");
            fprintf(f, "%d,%zu,%.3f,%.1f,%.3f,%.3f,%.3f,%.3f,%lld,%.6g\n", conns, n, secs, rps, p50, p95, p99, mx, errors,
                    cfg.rate);
            fclose(f);
        }
    }
    free(all);
    free(ws);
    free(th);
    return errors;
}

int main(int argc, char **argv)
{
    parse_args(argc, argv);
    signal(SIGPIPE, SIG_IGN);
    struct addrinfo hints = {0};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int g = getaddrinfo(cfg.host, cfg.port, &hints, &cfg.addr);
    if (g) {
        fprintf(stderr, "serve_load: cannot resolve '%s:%s': %s\n", cfg.host, cfg.port, gai_strerror(g));
        return 2;
    }
    build_request();
    long long errors = 0;
    for (int i = 0; i < cfg.n_levels; i++)
        errors += run_level(cfg.levels[i]);
    freeaddrinfo(cfg.addr);
    free(cfg.request);
    free(cfg.body);
    return errors ? 1 : 0;
}
