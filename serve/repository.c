/* The model repository of `ember serve`: Triton's layout and the subset of
 * its model configuration that applies, as JSON (config.json).
 *
 *   DIR/<model>/config.json                 optional
 *   DIR/<model>/<version>/model.safetensors  an `ember train` checkpoint; versions are
 *                                            positive integers (folder names)
 *   DIR/<model>/<version>/model.onnx         or an ONNX classifier: one FLOAT input
 *                                            [batch, static dims...], its first output
 *                                            served as "logits" [N, K] (serve/model.c)
 *
 * config.json keys (Triton's names, docs/user_guide/model_configuration.md):
 *   "name"                 must equal the folder's name when given
 *   "platform" / "backend" "ember" (model.safetensors) or "onnxruntime_onnx" /
 *                          "onnxruntime" (model.onnx, run by Ember's ONNX import);
 *                          without either a version folder must hold one of the two
 *   "max_batch_size"       rows per batch, >= 1 (default 64; Triton's 0, a
 *                          model without a batch dimension, is not offered)
 *   "dynamic_batching": {
 *       "preferred_batch_size": [int...],          each in 1..max_batch_size
 *       "max_queue_delay_microseconds": int,       default 0
 *       "default_queue_policy": {
 *           "max_queue_size": int,                 queued requests; default 1024 (0 also
 *                                                  means the default: the queue is always bounded)
 *           "default_timeout_microseconds": int,   0 = none
 *           "allow_timeout_override": bool }}      default true
 *   "instance_group": [ {"kind": "KIND_CPU" | "KIND_GPU", "count": int, "gpus": [int...]} ]
 *                          replaces --instances for this model (KIND_GPU: count
 *                          instances on each listed GPU, every GPU when "gpus" is absent)
 *   "input": [ {"name": str, "data_type": "TYPE_FP32" | "TYPE_INT64" | "TYPE_INT32", "dims": [int...]} ]
 *                          one input: its name, type and per-sample dims (the
 *                          dims' product must equal the model's input size; an
 *                          ONNX model's dims must equal its declared ones)
 *   "output": [ {"name": str, "data_type": "TYPE_FP32", "dims": [int...]} ]
 *                          checked against the model's outputs when given
 *   "version_policy": {"latest": {"num_versions": n}} | {"all": {}} | {"specific": {"versions": [...]}}
 *   "normalize": false | {"mean": [f...], "std": [f...]}
 *                          Ember's: the classifier's input normalisation,
 *                          (x - mean[c]) / std[c] per channel; by default the
 *                          checkpoint's own (ember.norm_mean / ember.norm_std);
 *                          an ONNX model's: none
 * Any other key is an error naming it (a typo must not be ignored).
 */
#define _GNU_SOURCE
#include "serve/serve_internal.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

double ems_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void ems_config_default(ems_model_config *c)
{
    memset(c, 0, sizeof *c);
    c->max_batch_size = 64;
    c->max_queue_size = 1024;
    c->allow_timeout_override = true;
    c->input_dtype = EMS_DTYPE_COUNT; /* the model kind's own */
    c->norm = -1;
    c->version_policy = EMS_VERSIONS_LATEST;
    c->latest_n = 1;
}

/* ---- instance lists ------------------------------------------------------ */

static int parse_instances(const char *list, ems_instance_spec *out, int max, bool check, char *err, size_t nerr);

int ems_parse_instances(const char *list, ems_instance_spec *out, int max, char *err, size_t nerr)
{
    return parse_instances(list, out, max, true, err, nerr);
}

int ems_check_instances(const char *list, char *err, size_t nerr)
{
    static ems_instance_spec scratch[EMS_MAX_INSTANCES];
    return parse_instances(list, scratch, EMS_MAX_INSTANCES, false, err, nerr) < 0 ? -1 : 0;
}

/* @p check false: the grammar only (no runtime needed); "all" then stands for no
 * device and a list whose only entries are "all" counts as giving instances. */
static int parse_instances(const char *list, ems_instance_spec *out, int max, bool check, char *err, size_t nerr)
{
    bool any_all = false;
    int n = 0;
    if (!list || !*list) {
        snprintf(err, nerr, "empty instance list");
        return -1;
    }
    const char *p = list;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        char item[64];
        if (len == 0 || len >= sizeof item) {
            snprintf(err, nerr, "bad instance entry '%.*s' in '%s' (cpu[:N], cuda:K, cuda:all, opencl:K, opencl:all)", (int)(len < 60 ? len : 60), p, list);
            return -1;
        }
        memcpy(item, p, len);
        item[len] = 0;
        char *colon = strchr(item, ':');
        const char *arg = colon ? colon + 1 : NULL;
        if (colon) *colon = 0;
        em_device_kind kind;
        if (!strcmp(item, "cpu")) kind = EM_DEVICE_CPU;
        else if (!strcmp(item, "cuda")) kind = EM_DEVICE_CUDA;
        else if (!strcmp(item, "opencl")) kind = EM_DEVICE_OPENCL;
        else {
            snprintf(err, nerr, "unknown instance kind '%s' in '%s' (cpu[:N], cuda:K, cuda:all, opencl:K, opencl:all)", item, list);
            return -1;
        }
        long v = -1;
        bool all = false;
        if (arg) {
            char *end;
            if (!strcmp(arg, "all") && kind != EM_DEVICE_CPU) all = true;
            else {
                errno = 0;
                v = strtol(arg, &end, 10);
                if (!*arg || *end || errno || v < 0 || v > EMS_MAX_INSTANCES) {
                    snprintf(err, nerr, "bad number '%s' in instance entry '%s:%s' (list '%s')", arg, item, arg, list);
                    return -1;
                }
            }
        } else if (kind != EM_DEVICE_CPU) {
            snprintf(err, nerr, "instance entry '%s' needs a device: %s:K or %s:all", item, item, item);
            return -1;
        }
        if (kind == EM_DEVICE_CPU) {
            long cnt = arg ? v : 1;
            if (check && cnt > 0 && em_worker_count(EM_DEVICE_CPU) < 1) {
                snprintf(err, nerr, "instance entry 'cpu' but this process has no CPU worker (EMBER_NCPU=0?)");
                return -1;
            }
            for (long i = 0; i < cnt; i++) {
                if (n >= max) goto toomany;
                out[n++].device = em_device_cpu();
            }
        } else {
            int ndev = check ? em_device_count(kind) : (all ? 0 : (int)v + 1);
            int lo = all ? 0 : (int)v, hi = all ? ndev : (int)v + 1;
            any_all = any_all || all;
            if (!all && (int)v >= ndev) {
                snprintf(err, nerr, "instance entry '%s:%ld': this process has %d %s device%s", item, v, ndev, item, ndev == 1 ? "" : "s");
                return -1;
            }
            for (int d = lo; d < hi; d++) {
                if (n >= max) goto toomany;
                out[n++].device = kind == EM_DEVICE_CUDA ? em_device_cuda(d) : em_device_opencl(d);
            }
        }
        p = e ? e + 1 : p + len;
        if (e && !*p) {
            snprintf(err, nerr, "instance list '%s' ends with a comma", list);
            return -1;
        }
    }
    if (n == 0 && (check || !any_all)) {
        snprintf(err, nerr, "instance list '%s' gives no instance%s", list, check ? " on this machine" : "");
        return -1;
    }
    return n;
toomany:
    snprintf(err, nerr, "instance list '%s' gives more than %d instances", list, max);
    return -1;
}

/* ---- config.json ----------------------------------------------------------- */

static int get_int(json_t *v, const char *key, int64_t lo, int64_t hi, int64_t *out, const char *path, char *err, size_t nerr)
{
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
        snprintf(err, nerr, "%s: \"%s\" must be an integer in [%lld, %lld]", path, key, (long long)lo, (long long)hi);
        return -1;
    }
    *out = json_integer_value(v);
    return 0;
}

static int unknown_key(const char *path, const char *where, const char *key, const char *known, char *err, size_t nerr)
{
    snprintf(err, nerr, "%s: unknown key \"%s\"%s%s (known: %s)", path, key, where[0] ? " in " : "", where, known);
    return -1;
}

static int parse_dims(json_t *v, const char *key, int64_t *dims, int *ndim, bool allow_var, const char *path, char *err, size_t nerr)
{
    if (!json_is_array(v) || json_array_size(v) < 1 || json_array_size(v) > EMS_MAX_RANK - 1) {
        snprintf(err, nerr, "%s: \"%s\" must be an array of 1 to %d integers", path, key, EMS_MAX_RANK - 1);
        return -1;
    }
    *ndim = (int)json_array_size(v);
    for (int i = 0; i < *ndim; i++) {
        json_t *d = json_array_get(v, (size_t)i);
        int64_t x;
        if (get_int(d, key, allow_var ? -1 : 1, INT32_MAX, &x, path, err, nerr)) return -1;
        if (x == 0) {
            snprintf(err, nerr, "%s: \"%s\" has a 0 dimension", path, key);
            return -1;
        }
        dims[i] = x;
    }
    return 0;
}

static int parse_input(json_t *arr, ems_model_config *c, const char *path, char *err, size_t nerr)
{
    if (!json_is_array(arr) || json_array_size(arr) != 1) {
        snprintf(err, nerr, "%s: \"input\" must be an array of one input (Ember's models take one)", path);
        return -1;
    }
    json_t *in = json_array_get(arr, 0);
    if (!json_is_object(in)) {
        snprintf(err, nerr, "%s: \"input\"[0] must be an object", path);
        return -1;
    }
    const char *k;
    json_t *v;
    json_object_foreach(in, k, v) {
        if (!strcmp(k, "name")) {
            if (!json_is_string(v) || !json_string_length(v) || json_string_length(v) >= EMS_NAME_MAX) {
                snprintf(err, nerr, "%s: input \"name\" must be a non-empty string shorter than %d bytes", path, EMS_NAME_MAX);
                return -1;
            }
            snprintf(c->input_name, sizeof c->input_name, "%s", json_string_value(v));
        } else if (!strcmp(k, "data_type")) {
            const char *s = json_is_string(v) ? json_string_value(v) : "";
            if (!strcmp(s, "TYPE_FP32")) c->input_dtype = EMS_FP32;
            else if (!strcmp(s, "TYPE_INT64")) c->input_dtype = EMS_INT64;
            else if (!strcmp(s, "TYPE_INT32")) c->input_dtype = EMS_INT32;
            else {
                snprintf(err, nerr, "%s: input \"data_type\" '%s' is not supported (TYPE_FP32 for classifiers, TYPE_INT64 or TYPE_INT32 for GPTs)", path, s);
                return -1;
            }
        } else if (!strcmp(k, "dims")) {
            if (parse_dims(v, "dims", c->input_dims, &c->input_ndim, true, path, err, nerr)) return -1;
        } else if (!strcmp(k, "format") || !strcmp(k, "reshape")) {
            snprintf(err, nerr, "%s: input \"%s\" is not supported by Ember", path, k);
            return -1;
        } else {
            return unknown_key(path, "input", k, "name, data_type, dims", err, nerr);
        }
    }
    return 0;
}

static int parse_floats(json_t *v, const char *key, float *out, int max, int *n, bool positive, const char *path, char *err, size_t nerr)
{
    if (!json_is_array(v) || json_array_size(v) < 1 || json_array_size(v) > (size_t)max) {
        snprintf(err, nerr, "%s: normalize \"%s\" must be an array of 1 to %d numbers", path, key, max);
        return -1;
    }
    *n = (int)json_array_size(v);
    for (int i = 0; i < *n; i++) {
        json_t *x = json_array_get(v, (size_t)i);
        double d = json_number_value(x);
        float f = (float)d;
        if (!json_is_number(x) || !isfinite(d) || !isfinite(f) || (positive && !(f > 0))) {
            snprintf(err, nerr, "%s: normalize \"%s\"[%d] must be a %snumber", path, key, i, positive ? "positive " : "finite ");
            return -1;
        }
        out[i] = (float)d;
    }
    return 0;
}

static int parse_instance_group(json_t *arr, ems_model_config *c, const char *path, char *err, size_t nerr)
{
    if (!json_is_array(arr) || json_array_size(arr) < 1) {
        snprintf(err, nerr, "%s: \"instance_group\" must be a non-empty array", path);
        return -1;
    }
    size_t i;
    json_t *g;
    c->ninstances = 0;
    json_array_foreach(arr, i, g) {
        if (!json_is_object(g)) {
            snprintf(err, nerr, "%s: instance_group[%zu] must be an object", path, i);
            return -1;
        }
        const char *kind = "KIND_GPU"; /* Triton's default kind when the model has GPUs: KIND_AUTO; ours must be said */
        int64_t count = 1;
        json_t *gpus = NULL;
        const char *k;
        json_t *v;
        bool have_kind = false;
        json_object_foreach(g, k, v) {
            if (!strcmp(k, "kind")) {
                if (!json_is_string(v)) {
                    snprintf(err, nerr, "%s: instance_group[%zu] \"kind\" must be a string", path, i);
                    return -1;
                }
                kind = json_string_value(v);
                have_kind = true;
            } else if (!strcmp(k, "count")) {
                if (get_int(v, "count", 0, EMS_MAX_INSTANCES, &count, path, err, nerr)) return -1;
            } else if (!strcmp(k, "gpus")) {
                gpus = v;
            } else if (!strcmp(k, "name")) {
                /* a label only */
            } else {
                return unknown_key(path, "instance_group", k, "kind, count, gpus, name", err, nerr);
            }
        }
        if (!have_kind) {
            snprintf(err, nerr, "%s: instance_group[%zu] needs \"kind\": \"KIND_CPU\" or \"KIND_GPU\"", path, i);
            return -1;
        }
        if (!strcmp(kind, "KIND_CPU")) {
            if (gpus) {
                snprintf(err, nerr, "%s: instance_group[%zu]: \"gpus\" with KIND_CPU", path, i);
                return -1;
            }
            if (em_worker_count(EM_DEVICE_CPU) < 1 && count > 0) {
                snprintf(err, nerr, "%s: instance_group[%zu]: KIND_CPU but this process has no CPU worker", path, i);
                return -1;
            }
            for (int64_t j = 0; j < count; j++) {
                if (c->ninstances >= EMS_MAX_INSTANCES) goto toomany;
                c->instances[c->ninstances++].device = em_device_cpu();
            }
        } else if (!strcmp(kind, "KIND_GPU")) {
            int ndev = em_device_count(EM_DEVICE_CUDA);
            int list[EMS_MAX_INSTANCES], nl = 0;
            if (gpus) {
                if (!json_is_array(gpus) || json_array_size(gpus) < 1 || json_array_size(gpus) > EMS_MAX_INSTANCES) {
                    snprintf(err, nerr, "%s: instance_group[%zu] \"gpus\" must be a non-empty array of GPU indices", path, i);
                    return -1;
                }
                size_t j;
                json_t *x;
                json_array_foreach(gpus, j, x) {
                    int64_t gi;
                    if (get_int(x, "gpus", 0, 1023, &gi, path, err, nerr)) return -1;
                    if (gi >= ndev) {
                        snprintf(err, nerr, "%s: instance_group[%zu] names GPU %lld but this process has %d GPU%s", path, i, (long long)gi,
                                 ndev, ndev == 1 ? "" : "s");
                        return -1;
                    }
                    list[nl++] = (int)gi;
                }
            } else {
                if (ndev < 1 && count > 0) {
                    snprintf(err, nerr, "%s: instance_group[%zu]: KIND_GPU but this process has no GPU", path, i);
                    return -1;
                }
                for (int d = 0; d < ndev && d < EMS_MAX_INSTANCES; d++) list[nl++] = d;
            }
            for (int d = 0; d < nl; d++)
                for (int64_t j = 0; j < count; j++) {
                    if (c->ninstances >= EMS_MAX_INSTANCES) goto toomany;
                    c->instances[c->ninstances++].device = em_device_cuda(list[d]);
                }
        } else {
            snprintf(err, nerr, "%s: instance_group[%zu] \"kind\" '%s' is not supported (KIND_CPU, KIND_GPU)", path, i, kind);
            return -1;
        }
    }
    if (c->ninstances == 0) {
        snprintf(err, nerr, "%s: \"instance_group\" gives no instance", path);
        return -1;
    }
    return 0;
toomany:
    snprintf(err, nerr, "%s: \"instance_group\" gives more than %d instances", path, EMS_MAX_INSTANCES);
    return -1;
}

static int parse_dynamic_batching(json_t *db, ems_model_config *c, const char *path, char *err, size_t nerr)
{
    if (!json_is_object(db)) {
        snprintf(err, nerr, "%s: \"dynamic_batching\" must be an object", path);
        return -1;
    }
    const char *k;
    json_t *v;
    json_object_foreach(db, k, v) {
        if (!strcmp(k, "preferred_batch_size")) {
            if (!json_is_array(v) || json_array_size(v) > EMS_MAX_PREFERRED) {
                snprintf(err, nerr, "%s: \"preferred_batch_size\" must be an array of at most %d integers", path, EMS_MAX_PREFERRED);
                return -1;
            }
            c->npreferred = (int)json_array_size(v);
            for (int i = 0; i < c->npreferred; i++)
                if (get_int(json_array_get(v, (size_t)i), "preferred_batch_size", 1, INT32_MAX, &c->preferred[i], path, err, nerr))
                    return -1;
        } else if (!strcmp(k, "max_queue_delay_microseconds")) {
            if (get_int(v, k, 0, 60000000, &c->max_queue_delay_us, path, err, nerr)) return -1;
        } else if (!strcmp(k, "default_queue_policy")) {
            if (!json_is_object(v)) {
                snprintf(err, nerr, "%s: \"default_queue_policy\" must be an object", path);
                return -1;
            }
            const char *k2;
            json_t *v2;
            json_object_foreach(v, k2, v2) {
                if (!strcmp(k2, "max_queue_size")) {
                    if (get_int(v2, k2, 0, 1 << 20, &c->max_queue_size, path, err, nerr)) return -1;
                    if (c->max_queue_size == 0) c->max_queue_size = 1024;
                } else if (!strcmp(k2, "default_timeout_microseconds")) {
                    if (get_int(v2, k2, 0, INT64_C(3600000000), &c->default_timeout_us, path, err, nerr)) return -1;
                } else if (!strcmp(k2, "allow_timeout_override")) {
                    if (!json_is_boolean(v2)) {
                        snprintf(err, nerr, "%s: \"allow_timeout_override\" must be true or false", path);
                        return -1;
                    }
                    c->allow_timeout_override = json_is_true(v2);
                } else if (!strcmp(k2, "timeout_action")) {
                    if (!json_is_string(v2) || strcmp(json_string_value(v2), "REJECT")) {
                        snprintf(err, nerr, "%s: \"timeout_action\" must be \"REJECT\" (DELAY is not supported)", path);
                        return -1;
                    }
                } else {
                    return unknown_key(path, "default_queue_policy", k2,
                                       "max_queue_size, default_timeout_microseconds, allow_timeout_override, timeout_action", err, nerr);
                }
            }
        } else if (!strcmp(k, "preserve_ordering")) {
            /* responses go to their own connections: ordering is per client */
        } else {
            return unknown_key(path, "dynamic_batching", k,
                               "preferred_batch_size, max_queue_delay_microseconds, default_queue_policy, preserve_ordering", err, nerr);
        }
    }
    return 0;
}

static int parse_version_policy(json_t *vp, ems_model_config *c, const char *path, char *err, size_t nerr)
{
    if (!json_is_object(vp) || json_object_size(vp) != 1) {
        snprintf(err, nerr, "%s: \"version_policy\" must be one of {\"latest\": {\"num_versions\": N}}, {\"all\": {}}, {\"specific\": {\"versions\": [...]}}", path);
        return -1;
    }
    json_t *v;
    const char *only = json_object_get(vp, "latest") ? "num_versions" : json_object_get(vp, "specific") ? "versions" : NULL;
    v = json_object_iter_value(json_object_iter(vp));
    if (!json_is_object(v)) {
        snprintf(err, nerr, "%s: \"version_policy\" %s must be an object", path, json_object_iter_key(json_object_iter(vp)));
        return -1;
    }
    const char *k;
    json_t *x;
    json_object_foreach(v, k, x) if (!only || strcmp(k, only)) {
        snprintf(err, nerr, "%s: unknown key \"%s\" in version_policy %s%s%s", path, k, json_object_iter_key(json_object_iter(vp)),
                 only ? " (known: " : " (it takes none)", only ? only : "");
        if (only) strncat(err, ")", nerr - strlen(err) - 1);
        return -1;
    }
    if ((v = json_object_get(vp, "latest"))) {
        c->version_policy = EMS_VERSIONS_LATEST;
        json_t *n = json_object_get(v, "num_versions");
        int64_t x = 1;
        if (n && get_int(n, "num_versions", 1, EMS_MAX_VERSIONS, &x, path, err, nerr)) return -1;
        c->latest_n = (int)x;
    } else if ((v = json_object_get(vp, "all"))) {
        c->version_policy = EMS_VERSIONS_ALL;
    } else if ((v = json_object_get(vp, "specific"))) {
        json_t *a = json_object_get(v, "versions");
        if (!json_is_array(a) || json_array_size(a) < 1 || json_array_size(a) > EMS_MAX_VERSIONS) {
            snprintf(err, nerr, "%s: version_policy \"specific\" needs \"versions\": [1 to %d versions]", path, EMS_MAX_VERSIONS);
            return -1;
        }
        c->version_policy = EMS_VERSIONS_SPECIFIC;
        c->nspecific = (int)json_array_size(a);
        for (int i = 0; i < c->nspecific; i++) {
            if (get_int(json_array_get(a, (size_t)i), "versions", 1, INT64_MAX, &c->specific[i], path, err, nerr)) return -1;
            for (int j = 0; j < i; j++)
                if (c->specific[j] == c->specific[i]) {
                    snprintf(err, nerr, "%s: version_policy \"specific\" lists version %lld twice", path, (long long)c->specific[i]);
                    return -1;
                }
        }
    } else {
        snprintf(err, nerr, "%s: \"version_policy\" must be latest, all or specific", path);
        return -1;
    }
    return 0;
}

int ems_config_read(const char *path, const char *model_name, ems_model_config *c, char *err, size_t nerr)
{
    ems_config_default(c);
    json_error_t je;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        if (errno == ENOENT && access(path, F_OK) != 0) return 0; /* no config.json: the defaults */
        snprintf(err, nerr, "%s: line %d column %d: %s", path, je.line, je.column, je.text);
        return -1;
    }
    int rc = -1;
    if (!json_is_object(root)) {
        snprintf(err, nerr, "%s: must hold a JSON object", path);
        goto out;
    }
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v) {
        if (!strcmp(k, "name")) {
            if (!json_is_string(v) || strcmp(json_string_value(v), model_name)) {
                snprintf(err, nerr, "%s: \"name\" must be the model folder's name '%s'", path, model_name);
                goto out;
            }
        } else if (!strcmp(k, "max_batch_size")) {
            if (get_int(v, k, 0, 1 << 20, &c->max_batch_size, path, err, nerr)) goto out;
            if (c->max_batch_size == 0) {
                snprintf(err, nerr, "%s: \"max_batch_size\" 0 (a model without a batch dimension) is not supported: use 1 or more", path);
                goto out;
            }
        } else if (!strcmp(k, "dynamic_batching")) {
            if (parse_dynamic_batching(v, c, path, err, nerr)) goto out;
        } else if (!strcmp(k, "instance_group")) {
            if (parse_instance_group(v, c, path, err, nerr)) goto out;
        } else if (!strcmp(k, "input")) {
            if (parse_input(v, c, path, err, nerr)) goto out;
        } else if (!strcmp(k, "output")) {
            /* checked against the model once it is loaded (ems_model_load) */
            if (!json_is_array(v)) {
                snprintf(err, nerr, "%s: \"output\" must be an array", path);
                goto out;
            }
            size_t i;
            json_t *o;
            json_array_foreach(v, i, o) {
                json_t *nm = json_object_get(o, "name");
                const char *s = json_is_string(nm) ? json_string_value(nm) : NULL;
                if (!s || (strcmp(s, "logits") && strcmp(s, "probabilities"))) {
                    snprintf(err, nerr, "%s: output[%zu] \"name\" must be \"logits\" or \"probabilities\" (Ember's outputs)", path, i);
                    goto out;
                }
                json_t *dt = json_object_get(o, "data_type");
                if (dt && (!json_is_string(dt) || strcmp(json_string_value(dt), "TYPE_FP32"))) {
                    snprintf(err, nerr, "%s: output '%s' \"data_type\" must be TYPE_FP32", path, s);
                    goto out;
                }
                const char *k2;
                json_t *v2;
                json_object_foreach(o, k2, v2) if (strcmp(k2, "name") && strcmp(k2, "data_type") && strcmp(k2, "dims")) {
                    unknown_key(path, "output", k2, "name, data_type, dims", err, nerr);
                    goto out;
                }
                json_t *dm = json_object_get(o, "dims");
                if (dm) {
                    int64_t d[EMS_MAX_RANK];
                    int nd;
                    if (parse_dims(dm, "dims", d, &nd, false, path, err, nerr)) goto out;
                    if (nd != 1 || c->noutput_dims >= EMS_MAX_OUTPUTS) {
                        snprintf(err, nerr, "%s: output '%s' \"dims\" must be [classes] (one value; Ember's outputs are [N, classes])", path, s);
                        goto out;
                    }
                    c->output_dims[c->noutput_dims] = d[0];
                    snprintf(c->output_dims_name[c->noutput_dims++], sizeof c->output_dims_name[0], "%s", s);
                }
            }
        } else if (!strcmp(k, "version_policy")) {
            if (parse_version_policy(v, c, path, err, nerr)) goto out;
        } else if (!strcmp(k, "normalize")) {
            if (json_is_false(v)) {
                c->norm = 0;
            } else if (json_is_object(v)) {
                int nm = 0, ns = 0;
                json_t *m = json_object_get(v, "mean"), *s = json_object_get(v, "std");
                if (!m || !s || json_object_size(v) != 2) {
                    snprintf(err, nerr, "%s: \"normalize\" must be false or {\"mean\": [...], \"std\": [...]}", path);
                    goto out;
                }
                if (parse_floats(m, "mean", c->mean, EMS_NORM_MAX, &nm, false, path, err, nerr) ||
                    parse_floats(s, "std", c->std, EMS_NORM_MAX, &ns, true, path, err, nerr))
                    goto out;
                if (nm != ns) {
                    snprintf(err, nerr, "%s: normalize \"mean\" has %d values and \"std\" %d", path, nm, ns);
                    goto out;
                }
                c->norm = 1;
                c->nnorm = nm;
            } else {
                snprintf(err, nerr, "%s: \"normalize\" must be false or {\"mean\": [...], \"std\": [...]}", path);
                goto out;
            }
        } else if (!strcmp(k, "platform") || !strcmp(k, "backend")) {
            const char *s = json_is_string(v) ? json_string_value(v) : "";
            int f = !strcmp(s, "ember") ? EMS_FORMAT_EMBER
                    : !strcmp(s, !strcmp(k, "platform") ? "onnxruntime_onnx" : "onnxruntime") ? EMS_FORMAT_ONNX : -1;
            if (f < 0 || (c->format != EMS_FORMAT_ANY && (int)c->format != f)) {
                if (f < 0)
                    snprintf(err, nerr, "%s: \"%s\" '%s' is not served here (only \"ember\" or \"%s\")", path, k, s,
                             !strcmp(k, "platform") ? "onnxruntime_onnx" : "onnxruntime");
                else snprintf(err, nerr, "%s: \"platform\" and \"backend\" disagree", path);
                goto out;
            }
            c->format = f;
        } else {
            unknown_key(path, "", k,
                        "name, platform, backend, max_batch_size, dynamic_batching, instance_group, input, output, version_policy, "
                        "normalize", err, nerr);
            goto out;
        }
    }
    for (int i = 0; i < c->npreferred; i++) {
        if (c->preferred[i] > c->max_batch_size) {
            snprintf(err, nerr, "%s: preferred_batch_size %lld is above max_batch_size %lld", path, (long long)c->preferred[i],
                     (long long)c->max_batch_size);
            goto out;
        }
    }
    /* ascending, no repeats */
    for (int i = 1; i < c->npreferred; i++)
        for (int j = i; j > 0 && c->preferred[j - 1] > c->preferred[j]; j--) {
            int64_t t = c->preferred[j];
            c->preferred[j] = c->preferred[j - 1];
            c->preferred[j - 1] = t;
        }
    int w = 0;
    for (int i = 0; i < c->npreferred; i++)
        if (w == 0 || c->preferred[w - 1] != c->preferred[i]) c->preferred[w++] = c->preferred[i];
    c->npreferred = w;
    rc = 0;
out:
    json_decref(root);
    return rc;
}

/* ---- the repository scan ---------------------------------------------------- */

static bool is_version_name(const char *s, int64_t *v)
{
    if (!*s || strlen(s) > 18) return false;
    for (const char *p = s; *p; p++)
        if (!isdigit((unsigned char)*p)) return false;
    if (s[0] == '0') return false;
    *v = strtoll(s, NULL, 10);
    return *v > 0;
}

static int cmp_i64_desc(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

static int cmp_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static bool valid_model_name(const char *s)
{
    if (!*s || strlen(s) >= EMS_NAME_MAX || s[0] == '.') return false;
    for (const char *p = s; *p; p++)
        if (!isalnum((unsigned char)*p) && *p != '_' && *p != '-' && *p != '.') return false;
    return true;
}

/* The model file of version @p v: model.safetensors or model.onnx, the one
 * config.json's "platform" / "backend" (@p format) names, else the one the
 * folder holds; both without a "platform" is an error naming both (as
 * Triton, which picks a file by the platform, Ember does not guess). Writes
 * the path into @p p. 0, or -1 with the reason in @p err. */
static int version_file(const char *dir, const char *name, int64_t v, int format, char *p, size_t np, char *err, size_t nerr)
{
    char st[4096], ox[4096];
    snprintf(st, sizeof st, "%s/%s/%lld/model.safetensors", dir, name, (long long)v);
    snprintf(ox, sizeof ox, "%s/%s/%lld/model.onnx", dir, name, (long long)v);
    bool has_st = access(st, F_OK) == 0, has_ox = access(ox, F_OK) == 0;
    if (format == EMS_FORMAT_ANY && has_st && has_ox) {
        snprintf(err, nerr, "%s/%s/%lld holds both model.safetensors and model.onnx: remove one, or choose with config.json's "
                            "\"platform\" (\"ember\" or \"onnxruntime_onnx\")", dir, name, (long long)v);
        return -1;
    }
    bool onnx = format == EMS_FORMAT_ONNX || (format == EMS_FORMAT_ANY && has_ox);
    snprintf(p, np, "%s", onnx ? ox : st);
    return 0;
}

int ems_repo_load(const char *dir, const ems_options *o, const ems_instance_spec *def_inst, int ndef, ems_repo *out)
{
    memset(out, 0, sizeof *out);
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "ember serve: --model-repository %s: %s\n", dir, strerror(errno));
        return -1;
    }
    char **names = NULL;
    int nn = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char p[4096];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode)) continue;
        if (nn == cap) {
            cap = cap ? 2 * cap : 16;
            char **t = realloc(names, (size_t)cap * sizeof *t);
            if (!t) break;
            names = t;
        }
        names[nn] = strdup(e->d_name);
        if (names[nn]) nn++;
    }
    closedir(d);
    if (nn > 1) qsort(names, (size_t)nn, sizeof *names, cmp_name);
    int bad = 0;
    for (int i = 0; i < nn; i++) {
        const char *name = names[i];
        char err[1024] = "", p[4096];
        if (!valid_model_name(name)) {
            fprintf(stderr, "ember serve: model '%s' skipped: a model name is letters, digits, '_', '-' and '.', not starting with '.'\n", name);
            bad++;
            continue;
        }
        ems_model_config cfg;
        snprintf(p, sizeof p, "%s/%s/config.json", dir, name);
        if (ems_config_read(p, name, &cfg, err, sizeof err) != 0) {
            fprintf(stderr, "ember serve: model '%s' skipped: %s\n", name, err);
            bad++;
            continue;
        }
        int64_t *vers = NULL;
        int nv = 0, vcap = 0;
        snprintf(p, sizeof p, "%s/%s", dir, name);
        DIR *vd = opendir(p);
        while (vd && (e = readdir(vd))) { /* every version folder, then the newest by policy */
            int64_t v;
            if (!is_version_name(e->d_name, &v)) continue;
            if (nv == vcap) {
                vcap = vcap ? 2 * vcap : 16;
                int64_t *t = realloc(vers, (size_t)vcap * sizeof *t);
                if (!t) break;
                vers = t;
            }
            vers[nv++] = v;
        }
        if (vd) closedir(vd);
        if (nv > 1) qsort(vers, (size_t)nv, sizeof *vers, cmp_i64_desc);
        int64_t pick[EMS_MAX_VERSIONS];
        int np = 0;
        if (cfg.version_policy == EMS_VERSIONS_LATEST) {
            for (int j = 0; j < nv && j < cfg.latest_n; j++) pick[np++] = vers[j];
        } else if (cfg.version_policy == EMS_VERSIONS_ALL) {
            for (int j = 0; j < nv && j < EMS_MAX_VERSIONS; j++) pick[np++] = vers[j];
            if (nv > EMS_MAX_VERSIONS)
                fprintf(stderr, "ember serve: model '%s': %d versions, serving the newest %d\n", name, nv, EMS_MAX_VERSIONS);
        } else {
            for (int j = 0; j < cfg.nspecific; j++) {
                bool found = false;
                for (int q = 0; q < nv; q++) found = found || vers[q] == cfg.specific[j];
                if (!found) {
                    snprintf(err, sizeof err, "version_policy names version %lld, which %s/%s does not have", (long long)cfg.specific[j], dir, name);
                    break;
                }
                pick[np++] = cfg.specific[j];
            }
            if (err[0]) {
                fprintf(stderr, "ember serve: model '%s' skipped: %s\n", name, err);
                bad++;
                free(vers);
                continue;
            }
        }
        free(vers);
        if (np == 0) {
            fprintf(stderr, "ember serve: model '%s' skipped: no version folder (%s/%s/<1, 2, ...>/model.safetensors or model.onnx)\n", name, dir, name);
            bad++;
            continue;
        }
        /* every picked version must load, or the model is skipped (as Triton marks it unavailable) */
        ems_model *ms[EMS_MAX_VERSIONS];
        int nm = 0;
        for (int j = 0; j < np; j++) {
            if (version_file(dir, name, pick[j], cfg.format, p, sizeof p, err, sizeof err) != 0) break;
            ms[nm] = ems_model_load(name, pick[j], p, &cfg, o, def_inst, ndef, err, sizeof err);
            if (!ms[nm]) break;
            nm++;
        }
        if (nm < np) {
            fprintf(stderr, "ember serve: model '%s' skipped: version %lld: %s\n", name, (long long)pick[nm], err);
            for (int j = 0; j < nm; j++) ems_model_free(ms[j]);
            bad++;
            continue;
        }
        ems_model **t = realloc(out->models, (size_t)(out->n + nm) * sizeof *t);
        if (!t) {
            for (int j = 0; j < nm; j++) ems_model_free(ms[j]);
            continue;
        }
        out->models = t;
        for (int j = 0; j < nm; j++) out->models[out->n++] = ms[j];
    }
    for (int i = 0; i < nn; i++) free(names[i]);
    free(names);
    if (out->n == 0) {
        fprintf(stderr, "ember serve: no model to serve in %s (%d skipped; a model is DIR/<name>/<version>/model.safetensors or model.onnx)\n", dir,
                bad);
        return -1;
    }
    return 0;
}

void ems_repo_flush(ems_repo *r)
{
    for (int i = 0; i < r->n; i++) {
        ems_model *m = r->models[i];
        pthread_mutex_lock(&m->mu);
        m->flush = true;
        pthread_cond_broadcast(&m->cv);
        pthread_mutex_unlock(&m->mu);
    }
}

void ems_repo_free(ems_repo *r)
{
    for (int i = 0; i < r->n; i++) ems_model_free(r->models[i]);
    free(r->models);
    memset(r, 0, sizeof *r);
}
