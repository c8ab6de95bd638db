/* `ember serve` (issue #18): the inference server's command line. The
 * server itself is serve/ (the ember_serve library); this file parses the
 * flags, starts the runtime and hands the server the program's model-spec
 * builder for classifier checkpoints. */
#include "tools/tools.h"

#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef EMBER_HAVE_SERVE
#include "serve/server.h"

/* The per-sample input dims of a classifier spec: "mlp:784-..." -> [784],
 * "cnn:CxHxW-..." -> [C, H, W] (tools.h's grammar; em_tool_check_spec has
 * checked it by the time the model is built). */
static int spec_dims(const char *spec, int64_t *dims, int *ndim)
{
    const char *p = strchr(spec, ':');
    if (!p) return -1;
    p++;
    int n = 0;
    while (n < 3) {
        char *end;
        long long v = strtoll(p, &end, 10);
        if (end == p || v < 1) return -1;
        dims[n++] = v;
        p = end;
        if (*p != 'x') break;
        p++;
    }
    if (!strncmp(spec, "mlp:", 4) ? n != 1 : n != 3) return -1;
    *ndim = n;
    return 0;
}

static em_module *build_classifier(const char *spec, int64_t *dims, int *ndim, char *err, size_t nerr)
{
    if (em_tool_check_spec(spec, err, nerr) != 0) return NULL;
    if (spec_dims(spec, dims, ndim) != 0) {
        snprintf(err, nerr, "cannot read the input size from the spec '%.200s'", spec);
        return NULL;
    }
    return em_tool_build_model(spec, err, nerr);
}
#endif

int em_tool_serve(int argc, char **argv)
{
#ifndef EMBER_HAVE_SERVE
    (void)argc;
    (void)argv;
    fprintf(stderr, "ember serve: this ember was built without libmicrohttpd (install libmicrohttpd-dev and rebuild)\n");
    return EM_TOOL_EXIT_RUNTIME;
#else
    ems_options o = ems_options_default();
    const char *device_list = NULL;
    int64_t port = 8000, max_body_mb = 64, conn = 1024, idle = 30, buffered_mb = 1024, per_ip = 0;
    double drain = 30;
    static const struct option opts[] = {{"model-repository", required_argument, 0, 'r'}, {"host", required_argument, 0, 'H'},
                                         {"port", required_argument, 0, 'p'},             {"instances", required_argument, 0, 'i'},
                                         {"max-body-mb", required_argument, 0, 'B'},      {"max-connections", required_argument, 0, 'C'},
                                         {"drain-timeout", required_argument, 0, 'T'},    {"verbose", no_argument, 0, 'v'},
                                         {"benchmark", required_argument, 0, 'b'},        {"idle-timeout", required_argument, 0, 'I'},
                                         {"max-buffered-mb", required_argument, 0, 'M'},  {"max-connections-per-ip", required_argument, 0, 'P'},
                                         {"help", no_argument, 0, 'h'},                   {0, 0, 0, 0}};
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":r:H:p:i:vh", opts, NULL)) != -1) {
        switch (c) {
        case 'r': o.repository = optarg; break;
        case 'H': o.host = optarg; break;
        case 'p': if (em_tool_parse_i64("serve", "--port", optarg, 0, 65535, &port)) return EM_TOOL_EXIT_USAGE; break;
        case 'i': device_list = optarg; break;
        case 'B': if (em_tool_parse_i64("serve", "--max-body-mb", optarg, 1, 4096, &max_body_mb)) return EM_TOOL_EXIT_USAGE; break;
        case 'C': if (em_tool_parse_i64("serve", "--max-connections", optarg, 1, 65536, &conn)) return EM_TOOL_EXIT_USAGE; break;
        case 'T':
            if (em_tool_parse_f64("serve", "--drain-timeout", optarg, 0, false, 3600, false, &drain)) return EM_TOOL_EXIT_USAGE;
            break;
        case 'v': o.verbose = true; break;
        case 'P': if (em_tool_parse_i64("serve", "--max-connections-per-ip", optarg, 0, 65536, &per_ip)) return EM_TOOL_EXIT_USAGE; break;
        case 'M': if (em_tool_parse_i64("serve", "--max-buffered-mb", optarg, 1, 1 << 20, &buffered_mb)) return EM_TOOL_EXIT_USAGE; break;
        case 'I': if (em_tool_parse_i64("serve", "--idle-timeout", optarg, 1, 86400, &idle)) return EM_TOOL_EXIT_USAGE; break;
        case 'b':
            if (em_tool_parse_f64("serve", "--benchmark", optarg, 0, true, 3600, false, &o.benchmark_s)) return EM_TOOL_EXIT_USAGE;
            break;
        case 'h':
            printf("usage: ember serve --model-repository DIR [--host ADDR] [--port N] [--instances LIST]\n"
                   "                   [--max-body-mb N] [--max-buffered-mb N] [--max-connections N]\n"
                   "                   [--max-connections-per-ip N] [--idle-timeout S] [--drain-timeout S] [--verbose]\n"
                   "       ember serve --model-repository DIR --benchmark S [--instances LIST]\n\n"
                   "Serves the models of a repository over HTTP/1.1 with the KServe v2 (Open Inference\n"
                   "Protocol) REST API, dynamic batching per model and model instances on the CPU and\n"
                   "on every GPU at once. The repository is laid out as Triton's:\n"
                   "  DIR/<model>/config.json                  optional: max_batch_size, dynamic_batching,\n"
                   "                                           instance_group, input, version_policy, normalize,\n"
                   "                                           platform\n"
                   "  DIR/<model>/<version>/model.safetensors  a checkpoint of 'ember train' (MLP, CNN or GPT)\n"
                   "  DIR/<model>/<version>/model.onnx         or an ONNX classifier: one FLOAT input [N, static\n"
                   "                                           dims], its first output served as 'logits'\n"
                   "The newest version serves by default; a model that fails to load is reported\n"
                   "and skipped. Endpoints: GET /v2/health/live, /v2/health/ready, /v2,\n"
                   "/v2/models/M[/versions/V][/ready], POST /v2/models/M[/versions/V]/infer (JSON\n"
                   "tensors or the binary-data extension), GET /metrics (Prometheus).\n"
                   "Inputs: a classifier takes 'input' FP32 [N, <its input dims>] in [0, 1] and\n"
                   "normalises it as in training; outputs 'logits' and 'probabilities' [N, classes].\n"
                   "An ONNX model takes its own input name and dims, normalised only by config.json.\n"
                   "A GPT takes 'input_ids' INT64 [N, T] and gives 'logits' [N, vocab] of the last token.\n"
                   "SIGTERM or Ctrl-C stops accepting, finishes the requests in flight and exits 0.\n\n"
                   "  --model-repository DIR  the model repository (required)\n"
                   "  --host ADDR             address to listen on (default 127.0.0.1; 0.0.0.0 for every interface)\n"
                   "  --port N                TCP port (default 8000; 0 picks a free one, printed at start)\n"
                   "  --instances LIST        default instances of every model (default cpu:1,cuda:all):\n"
                   "                          cpu[:N] N instances on the CPU workers, cuda:K one on GPU K,\n"
                   "                          cuda:all one per GPU (none without a GPU), opencl:K, opencl:all\n"
                   "  --max-body-mb N         larger request bodies are answered 413 (default 64; an infer request\n"
                   "                          may also not exceed what a full batch of its model needs)\n"
                   "  --max-buffered-mb N     request bodies of all connections together; beyond, 503 (default 1024)\n"
                   "  --max-connections N     open connections at most (default 1024); more wait in the kernel's backlog\n"
                   "  --max-connections-per-ip N  open connections per client address (default 0: no limit)\n"
                   "  --idle-timeout S        close a connection idle for S seconds (default 30)\n"
                   "  --drain-timeout S       on SIGTERM, wait at most S seconds for requests in flight, then exit 1\n"
                   "                          without them (default 30)\n"
                   "  --verbose               one log line per inference request\n"
                   "  --benchmark S           do not listen: run every model's batched forward (max_batch_size rows;\n"
                   "                          a GPT's rows of 128 tokens) on all its instances at once for S seconds\n"
                   "                          and print rows/s: the offline throughput to compare the server's with\n\n" EM_TOOL_EXIT_HELP);
            return 0;
        default: return em_tool_bad_option("serve", c, argc, argv);
        }
    }
    if (em_tool_no_operands("serve", argc, argv)) return EM_TOOL_EXIT_USAGE;
    if (!o.repository) {
        fprintf(stderr, "ember serve: --model-repository DIR is required (see 'ember serve --help')\n");
        return EM_TOOL_EXIT_USAGE;
    }
    o.port = (int)port;
    o.max_body_bytes = (size_t)max_body_mb << 20;
    o.max_buffered_bytes = (size_t)buffered_mb << 20;
    o.connection_limit = (unsigned)conn;
    o.per_ip_limit = (unsigned)per_ip;
    o.drain_timeout_s = drain;
    o.idle_timeout_s = (unsigned)idle;
    if (device_list) {
        char err[512];
        if (ems_check_instances(device_list, err, sizeof err) != 0) {
            fprintf(stderr, "ember serve: --instances: %s\n", err);
            return EM_TOOL_EXIT_USAGE;
        }
        o.instances = device_list;
    }
    o.build_classifier = build_classifier;
    /* SIGINT / SIGTERM reach ems_serve through its self-pipe, whichever thread
     * they land on: installed before the runtime starts its threads */
    if (o.benchmark_s <= 0 && ems_signals_install() != 0) { /* --benchmark: Ctrl-C ends it as any program */
        perror("ember serve: signal handlers");
        return EM_TOOL_EXIT_RUNTIME;
    }
    signal(SIGPIPE, SIG_IGN); /* a client that hangs up is libmicrohttpd's to notice */
    if (em_tool_init_runtime(NULL)) return EM_TOOL_EXIT_RUNTIME;
    int rc = ems_serve(&o);
    em_shutdown();
    return rc;
#endif
}
