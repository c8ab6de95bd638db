/* `ember serve`: the inference server (issue #18; DESIGN.md §9).
 *
 *   HTTP (libmicrohttpd, a thread per connection)  serve/http.c
 *     -> per-model bounded queue -> dynamic batcher  serve/model.c
 *     -> model instances (a thread each, on the CPU workers or one GPU) that
 *        run one forward per batch as Ember ops (StarPU tasks)
 *     -> responses (KServe v2 JSON or binary tensors, serve/protocol.c).
 *
 * The model repository is laid out as Triton's:
 *   DIR/<model>/config.json              optional (serve/repository.c)
 *   DIR/<model>/<version>/model.safetensors   or   model.onnx
 * where model.safetensors is a checkpoint of `ember train` (its metadata
 * 'ember.model' names the architecture) and model.onnx an ONNX classifier
 * run by libember's ONNX import (ember/onnx.h). The library above libember
 * uses only Ember's public API.
 */
#ifndef EMBER_SERVE_SERVER_H
#define EMBER_SERVE_SERVER_H

#include "ember/ember.h"
#include "serve/protocol.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/** Builds a classifier from an 'ember.model' spec that is not a GPT's
 *  ("mlp:...", "cnn:..."; the `ember` program passes its spec builder).
 *  On success also gives the per-sample input dims (without the batch dim:
 *  [784] for "mlp:784-...", [C, H, W] for "cnn:CxHxW-..."). NULL with the
 *  reason in @p err otherwise. */
typedef em_module *(*ems_build_fn)(const char *spec, int64_t *dims, int *ndim, char *err, size_t nerr);

/** Options of ems_serve (the flags of `ember serve`). */
typedef struct ems_options {
    const char *repository;   /**< the model repository folder (required) */
    const char *host;         /**< address to listen on; "127.0.0.1" when NULL */
    int port;                 /**< TCP port, 0 = any free port (the log line says which); 8000 by default */
    const char *instances;    /**< default instances of every model: "cpu:1,cuda:all" when NULL (grammar: ems_parse_instances) */
    size_t max_body_bytes;    /**< request bodies above this are answered 413 (default 64 MiB); an infer
                                   request's limit is also what its model can need (a full batch) */
    size_t max_buffered_bytes;/**< request bodies held by all connections together; beyond, 503 (default 1 GiB) */
    ems_limits limits;        /**< tensor limits of the request decoder */
    unsigned connection_limit;/**< open connections at most (default 1024); more wait in the listen backlog */
    unsigned per_ip_limit;    /**< open connections per client address at most; 0 (default) = no limit */
    double drain_timeout_s;   /**< on SIGTERM/SIGINT: wait this long for in-flight requests (default 30);
                                   past it the process exits at once with status 1 */
    unsigned idle_timeout_s;  /**< a connection idle this long is closed (default 30) */
    ems_build_fn build_classifier;
    bool verbose;             /**< one log line per request */
    double benchmark_s;       /**< > 0: do not listen; run every model's offline benchmark for this many
                                   seconds (batches of max_batch_size on all its instances at once) and return */
} ems_options;

/** The defaults above, repository NULL. */
ems_options ems_options_default(void);

/** One model instance's place. */
typedef struct ems_instance_spec {
    em_device device;
} ems_instance_spec;

#define EMS_MAX_INSTANCES 64

/** Parses an instance list: comma-separated entries
 *    cpu[:N]        N instances (default 1) on the CPU workers; cpu:0 none
 *    cuda:K         one instance on GPU K        (opencl:K likewise)
 *    cuda:all       one instance on every GPU this process drives (none
 *                   when there is no GPU: that is not an error)
 *  An entry may repeat (cuda:0,cuda:0 = two instances on GPU 0). Needs the
 *  runtime started (em_init) for "all" and to check that devices exist.
 *  Returns the number of instances (>= 1), or -1 with the reason in @p err
 *  (a bad entry, a device that does not exist, or no instance at all). */
int ems_parse_instances(const char *list, ems_instance_spec *out, int max, char *err, size_t nerr);
/** The grammar of an instance list alone (no runtime needed: devices are not
 *  looked up): 0, or -1 with the reason in @p err (a usage error). */
int ems_check_instances(const char *list, char *err, size_t nerr);

/** Installs ems_serve's SIGINT / SIGTERM handlers (a self-pipe that the
 *  server's main loop reads) and unblocks both signals in the calling
 *  thread. Call it first, before em_init starts threads, so that a signal
 *  during start-up is seen too. 0, or -1 (errno). */
int ems_signals_install(void);

/** Runs the server: em_init and ems_signals_install must have been called.
 *  Loads the repository, listens, and waits for SIGINT or SIGTERM, then
 *  drains (stops accepting connections, answers new requests 503, sends the
 *  queued requests at once without waiting for their batch's queue delay,
 *  finishes the in-flight ones within drain_timeout_s) and returns. Returns
 *  0 after a clean drain, 1 when it could not start (the reason printed on
 *  stderr: bad repository, no model served, port in use); when the drain
 *  times out, or on a second signal during the drain, the process exits at
 *  once (_exit) with 1, or 128 + the signal. A signal during the load
 *  stops it after the load with 0. */
int ems_serve(const ems_options *o);

#endif
