/* `ember run MODEL.onnx`: runs an ONNX model (store/onnx*.c) on inputs from
 * .npy files and prints (or saves) its outputs. */
#include "tools/tools.h"

#include "ember/onnx.h"

#include <errno.h>
#include <getopt.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_INPUTS 64

static const char RUN_HELP[] =
    "usage: ember run MODEL.onnx [--input [NAME=]FILE.npy]... [--device DEV]\n"
    "                 [--output-dir DIR] [--repeat N] [--print-limit K]\n\n"
    "Runs an ONNX model's graph as Ember ops (em_onnx_load) and prints every\n"
    "output's name, dtype, shape and values.\n\n"
    "  --input [NAME=]FILE.npy  an input from a .npy file (NAME may be left out for\n"
    "                           a model of one input); every graph input needs one\n"
    "  --device DEV             cpu, cuda:N, opencl:N, auto (default: EMBER_DEVICE or cpu)\n"
    "  --output-dir DIR         also write each output to DIR/<output name>.npy (DIR is\n"
    "                           created when missing)\n"
    "                           (characters of the name other than [A-Za-z0-9._-] become '_')\n"
    "  --repeat N               run N more times after the first and print the median,\n"
    "                           fastest and slowest wall time per run (ms)\n"
    "  --print-limit K          print at most K values per output (default 20; 0: none)\n\n" EM_TOOL_EXIT_HELP;

/* mkdir -p: 0, or -1 with errno. */
static int make_dirs(const char *dir)
{
    char p[4096];
    snprintf(p, sizeof p, "%s", dir);
    for (char *s = p + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            if (mkdir(p, 0777) != 0 && errno != EEXIST) return -1;
            *s = '/';
        }
    if (mkdir(p, 0777) != 0 && errno != EEXIST) return -1;
    struct stat sb;
    if (stat(p, &sb) != 0) return -1;
    if (!S_ISDIR(sb.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void print_values(const em_tensor *t, int64_t limit)
{
    int64_t n = em_tensor_numel(t);
    if (limit <= 0 || n == 0) return;
    int64_t k = n < limit ? n : limit;
    double *v = malloc(sizeof(double) * (size_t)n);
    em_scope_begin();
    em_tensor *d = em_cast(t, EM_F64);
    if (v && d && em_to_host(d, v, sizeof(double) * (size_t)n) == EM_OK) {
        printf("  [");
        for (int64_t i = 0; i < k; i++) printf("%s%.7g", i ? ", " : "", v[i]);
        printf("%s]\n", k < n ? ", ..." : "");
    }
    em_scope_end();
    free(v);
}

int em_tool_run(int argc, char **argv)
{
    static const struct option opts[] = {{"input", required_argument, 0, 'i'},      {"device", required_argument, 0, 'D'},
                                         {"output-dir", required_argument, 0, 'o'}, {"repeat", required_argument, 0, 'r'},
                                         {"print-limit", required_argument, 0, 'p'}, {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *inputs[MAX_INPUTS], *device = NULL, *outdir = NULL;
    int nspec = 0;
    int64_t repeat = 0, limit = 20;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":i:D:o:r:p:h", opts, NULL)) != -1) {
        switch (c) {
        case 'i':
            if (nspec == MAX_INPUTS) {
                fprintf(stderr, "ember run: more than %d --input options\n", MAX_INPUTS);
                return EM_TOOL_EXIT_USAGE;
            }
            inputs[nspec++] = optarg;
            break;
        case 'D': device = optarg; break;
        case 'o': outdir = optarg; break;
        case 'r':
            if (em_tool_parse_i64("run", "--repeat", optarg, 0, 1000000, &repeat) != 0) return EM_TOOL_EXIT_USAGE;
            break;
        case 'p':
            if (em_tool_parse_i64("run", "--print-limit", optarg, 0, INT64_MAX, &limit) != 0) return EM_TOOL_EXIT_USAGE;
            break;
        case 'h': fputs(RUN_HELP, stdout); return 0;
        default: return em_tool_bad_option("run", c, argc, argv);
        }
    }
    if (optind != argc - 1) {
        fprintf(stderr, "ember run: %s\n%s", optind >= argc ? "missing MODEL.onnx" : "more than one model given", RUN_HELP);
        return EM_TOOL_EXIT_USAGE;
    }
    const char *path = argv[optind];
    if (em_tool_check_device("run", device) != 0) return EM_TOOL_EXIT_USAGE;
    if (outdir && make_dirs(outdir) != 0) {
        fprintf(stderr, "ember run: --output-dir %s: %s\n", outdir, strerror(errno));
        return EM_TOOL_EXIT_RUNTIME;
    }
    if (em_tool_init_runtime(device) != 0) return EM_TOOL_EXIT_RUNTIME;
    int rc = EM_TOOL_EXIT_RUNTIME;
    const char *err = NULL;
    em_tensor *in[MAX_INPUTS] = {0}, *out[MAX_INPUTS] = {0};
    em_onnx_model *m = em_onnx_load(path, &err);
    if (!m) {
        fprintf(stderr, "ember run: %s\n", err);
        goto done;
    }
    int nin = em_onnx_num_inputs(m), nout = em_onnx_num_outputs(m);
    if (nin > MAX_INPUTS || nout > MAX_INPUTS) {
        fprintf(stderr, "ember run: %s: more than %d inputs or outputs\n", path, MAX_INPUTS);
        goto done;
    }
    for (int s = 0; s < nspec; s++) {
        const char *eq = strchr(inputs[s], '=');
        int which = -1;
        const char *file = inputs[s];
        if (eq) {
            for (int i = 0; i < nin; i++)
                if (strlen(em_onnx_input_name(m, i)) == (size_t)(eq - inputs[s]) &&
                    !strncmp(em_onnx_input_name(m, i), inputs[s], (size_t)(eq - inputs[s])))
                    which = i;
            file = eq + 1;
            if (which < 0) {
                fprintf(stderr, "ember run: --input %s: the model has no input '%.*s' (inputs:", inputs[s],
                        (int)(eq - inputs[s]), inputs[s]);
                for (int i = 0; i < nin; i++) fprintf(stderr, " %s", em_onnx_input_name(m, i));
                fprintf(stderr, ")\n");
                rc = EM_TOOL_EXIT_USAGE;
                goto done;
            }
        } else if (nin == 1) {
            which = 0;
        } else {
            fprintf(stderr, "ember run: --input %s: the model has %d inputs, name them: --input NAME=FILE.npy\n", inputs[s], nin);
            rc = EM_TOOL_EXIT_USAGE;
            goto done;
        }
        if (in[which]) {
            fprintf(stderr, "ember run: input '%s' is given twice\n", em_onnx_input_name(m, which));
            rc = EM_TOOL_EXIT_USAGE;
            goto done;
        }
        if (!(in[which] = em_npy_load(file))) {
            fprintf(stderr, "ember run: --input %s: %s\n", inputs[s], em_last_error());
            goto done;
        }
    }
    for (int i = 0; i < nin; i++)
        if (!in[i]) {
            fprintf(stderr, "ember run: input '%s' (%s) has no --input\n", em_onnx_input_name(m, i),
                    em_dtype_name(em_onnx_input_dtype(m, i)));
            rc = EM_TOOL_EXIT_USAGE;
            goto done;
        }
    em_no_grad_begin();
    double t0 = now_ms();
    em_status st = em_onnx_run(m, in, nin, out, nout);
    if (st == EM_OK) st = em_sync();
    double first = now_ms() - t0;
    double *times = repeat ? malloc(sizeof(double) * (size_t)repeat) : NULL;
    for (int64_t r = 0; st == EM_OK && r < repeat; r++) {
        em_tensor *o2[MAX_INPUTS] = {0};
        t0 = now_ms();
        st = em_onnx_run(m, in, nin, o2, nout);
        if (st == EM_OK) st = em_sync();
        times[r] = now_ms() - t0;
        for (int k = 0; k < nout; k++) em_tensor_release(o2[k]);
    }
    em_no_grad_end();
    if (st != EM_OK) {
        fprintf(stderr, "ember run: %s\n", em_last_error());
        free(times);
        goto done;
    }
    char dn[64];
    em_device_str(em_get_device(), dn, sizeof dn);
    printf("ember run: %s (opset %d, %d initializers), device %s, first run %.3f ms\n", path, em_onnx_opset(m),
           em_onnx_num_initializers(m), dn, first);
    for (int k = 0; k < nout; k++) {
        char sb[160];
        printf("output %s: %s %s\n", em_onnx_output_name(m, k), em_dtype_name(em_tensor_dtype(out[k])),
               em_shape_str(em_tensor_shape(out[k]), em_tensor_ndim(out[k]), sb, sizeof sb));
        print_values(out[k], limit);
        if (outdir) {
            char fn[4096], nm[256];
            snprintf(nm, sizeof nm, "%s", em_onnx_output_name(m, k));
            for (char *p = nm; *p; p++)
                if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '.' ||
                      *p == '_' || *p == '-'))
                    *p = '_';
            snprintf(fn, sizeof fn, "%s/%s.npy", outdir, nm);
            em_tensor *o = out[k];
            em_scope_begin();
            if (em_tensor_dtype(o) == EM_BF16) o = em_cast(o, EM_F32);
            em_status ss = em_npy_save(fn, o);
            em_scope_end();
            if (ss != EM_OK) {
                fprintf(stderr, "ember run: %s\n", em_last_error());
                free(times);
                goto done;
            }
            printf("  wrote %s\n", fn);
        }
    }
    if (repeat) {
        qsort(times, (size_t)repeat, sizeof *times, cmp_double);
        printf("time per run over %lld runs: median %.3f ms, fastest %.3f ms, slowest %.3f ms\n", (long long)repeat,
               times[repeat / 2], times[0], times[repeat - 1]);
    }
    free(times);
    rc = 0;
done:
    for (int i = 0; i < MAX_INPUTS; i++) {
        em_tensor_release(in[i]);
        em_tensor_release(out[i]);
    }
    em_onnx_free(m);
    em_shutdown();
    return rc;
}
