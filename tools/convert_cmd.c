/* `ember convert IN OUT.safetensors`: a model file of another framework to
 * SafeTensors. The input format is chosen by IN's extension (input_formats
 * below); each reader fills a list of named tensors, and one writer saves
 * them (em_safetensors_save: atomic, so an error never leaves a partial
 * OUT). */
#include "tools/tools.h"

#include "ember/onnx.h"
#include "ember/store.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define CMD "convert"
#define MAX_RULES 64

static void help(void)
{
    printf("usage: ember convert IN OUT.safetensors [--rename PATTERN=REPLACEMENT]...\n\n"
           "Converts a model file to SafeTensors (the format `ember` reads and writes).\n"
           "Inputs, by extension:\n"
           "  .pt .pth .bin .ckpt  PyTorch checkpoints written by torch.save (torch >= 1.6):\n"
           "                       a state_dict, or a dict holding one (nested keys are\n"
           "                       joined with '.': \"model.fc1.weight\"); non-tensor values\n"
           "                       are skipped. Only the pickle subset a state_dict needs is\n"
           "                       read; nothing in the file is executed.\n"
           "  .onnx                ONNX models: every initializer (the weights) under its\n"
           "                       ONNX name (em_onnx_load checks the whole model first).\n\n"
           "Tensors keep their dtype and bits; views are written contiguous. OUT gets the\n"
           "metadata {\"format\": \"pt\"} (or \"onnx\") and is written atomically (an error\n"
           "leaves no file, and an existing OUT untouched). Prints one line: the tensor\n"
           "count and the bytes of tensor data.\n\n"
           "options:\n"
           "  --rename PATTERN=REPLACEMENT  rename keys: PATTERN is a POSIX extended regex,\n"
           "                       every match is replaced, \\1..\\9 are its groups; rules\n"
           "                       apply in order (repeatable, up to %d), e.g.\n"
           "                       --rename '^model\\.=' --rename '^fc([0-9])=layers.\\1'\n"
           "  -h, --help           this help\n\n" EM_TOOL_EXIT_HELP,
           MAX_RULES);
}

/* What a reader hands the writer: names and tensors (owned). */
typedef struct tensor_list {
    char **names;
    em_tensor **ts;
    size_t n;
    const char *format; /* the "format" metadata value */
} tensor_list;

static void list_free(tensor_list *l)
{
    for (size_t i = 0; i < l->n; i++) {
        free(l->names[i]);
        em_tensor_release(l->ts[i]);
    }
    free(l->names);
    free(l->ts);
    memset(l, 0, sizeof *l);
}

/* Fills @p out from @p n named tensors (new references each, taken over),
 * keys remapped by the rules; a rule mapping two keys to one is an error.
 * 0 or -1 (message printed). */
static int fill_list(const char *in, const char *format, const char *const rules[], int nrules, size_t n,
                     const char *(*name_at)(void *, size_t), em_tensor *(*tensor_at)(void *, size_t), void *src,
                     tensor_list *out)
{
    out->names = calloc(n ? n : 1, sizeof *out->names);
    out->ts = calloc(n ? n : 1, sizeof *out->ts);
    out->format = format;
    if (!out->names || !out->ts) {
        fprintf(stderr, "ember convert: out of memory\n");
        return -1;
    }
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        char key[4096];
        if (em_pt_remap_key(rules, nrules, name_at(src, i), key, sizeof key) != EM_OK ||
            !(out->names[i] = strdup(key)) || !(out->ts[i] = tensor_at(src, i))) {
            fprintf(stderr, "ember convert: %s: %s\n", in, em_last_error());
            rc = -1;
        }
        out->n = i + 1;
        for (size_t j = 0; j < i && rc == 0 && nrules; j++)
            if (!strcmp(out->names[j], out->names[i])) {
                fprintf(stderr, "ember convert: %s: --rename maps both '%s' and '%s' to '%s'\n", in, name_at(src, j),
                        name_at(src, i), key);
                rc = -1;
            }
    }
    return rc;
}

static const char *pt_name_at(void *f, size_t i) { return em_pt_name(f, i); }
static em_tensor *pt_tensor_at(void *f, size_t i) { return em_pt_tensor(f, i); }

/* PyTorch: every tensor of the checkpoint. 0 or -1 (message printed). */
static int convert_pt(const char *in, const char *const rules[], int nrules, tensor_list *out)
{
    em_pt_file *f = em_pt_open(in);
    if (!f) {
        fprintf(stderr, "ember convert: %s\n", em_last_error());
        return -1;
    }
    int rc = fill_list(in, "pt", rules, nrules, em_pt_count(f), pt_name_at, pt_tensor_at, f, out);
    em_pt_close(f);
    return rc;
}

static const char *onnx_name_at(void *m, size_t i) { return em_onnx_initializer_name(m, (int)i); }
static em_tensor *onnx_tensor_at(void *m, size_t i) { return em_tensor_retain(em_onnx_initializer(m, (int)i)); }

/* ONNX: every initializer (the weights), under its ONNX name; INT8 / INT16 /
 * UINT16 initializers are written as I32 and UINT32 as I64 (how Ember holds
 * them). 0 or -1 (message printed). */
static int convert_onnx(const char *in, const char *const rules[], int nrules, tensor_list *out)
{
    const char *err = NULL;
    em_onnx_model *m = em_onnx_load(in, &err);
    if (!m) {
        fprintf(stderr, "ember convert: %s\n", err);
        return -1;
    }
    int rc = fill_list(in, "onnx", rules, nrules, (size_t)em_onnx_num_initializers(m), onnx_name_at, onnx_tensor_at, m, out);
    em_onnx_free(m);
    return rc;
}

/* Input formats by extension. */
static const struct {
    const char *ext;
    int (*read)(const char *in, const char *const rules[], int nrules, tensor_list *out);
} input_formats[] = {
    {".pt", convert_pt},
    {".pth", convert_pt},
    {".bin", convert_pt}, /* Hugging Face's pytorch_model.bin is a torch.save file */
    {".ckpt", convert_pt},
    {".onnx", convert_onnx},
};

static const char *ext_of(const char *path)
{
    const char *slash = strrchr(path, '/'), *dot = strrchr(path, '.');
    return dot && (!slash || dot > slash) ? dot : "";
}

int em_tool_convert(int argc, char **argv)
{
    static const struct option opts[] = {{"rename", required_argument, 0, 'r'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    const char *rules[MAX_RULES];
    int nrules = 0, c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":r:h", opts, NULL)) != -1) {
        switch (c) {
        case 'r':
            if (nrules == MAX_RULES) {
                fprintf(stderr, "ember convert: more than %d --rename rules\n", MAX_RULES);
                return EM_TOOL_EXIT_USAGE;
            }
            rules[nrules++] = optarg;
            break;
        case 'h': help(); return 0;
        default: return em_tool_bad_option(CMD, c, argc, argv);
        }
    }
    if (argc - optind != 2) {
        fprintf(stderr, "ember convert: expected IN and OUT.safetensors, got %d argument%s (see 'ember convert --help')\n",
                argc - optind, argc - optind == 1 ? "" : "s");
        return EM_TOOL_EXIT_USAGE;
    }
    const char *in = argv[optind], *out = argv[optind + 1];
    if (strcasecmp(ext_of(out), ".safetensors") != 0) {
        fprintf(stderr, "ember convert: %s: the output must be a .safetensors file\n", out);
        return EM_TOOL_EXIT_USAGE;
    }
    int (*read)(const char *, const char *const[], int, tensor_list *) = NULL;
    for (size_t i = 0; i < sizeof input_formats / sizeof input_formats[0]; i++)
        if (!strcasecmp(ext_of(in), input_formats[i].ext)) read = input_formats[i].read;
    if (!read) {
        fprintf(stderr, "ember convert: %s: unsupported input format '%s' (known: .pt .pth .bin .ckpt .onnx)\n", in,
                ext_of(in)[0] ? ext_of(in) : "no extension");
        return EM_TOOL_EXIT_USAGE;
    }
    /* the rules' syntax, before reading anything */
    char scratch[4096];
    if (nrules && em_pt_remap_key(rules, nrules, "", scratch, sizeof scratch) != EM_OK &&
        strstr(em_last_error(), "key rule")) {
        fprintf(stderr, "ember convert: --rename: %s\n", em_last_error());
        return EM_TOOL_EXIT_USAGE;
    }

    em_config ec = em_config_default();
    ec.device = "cpu"; /* host memory only: no device is needed to copy tensors to a file */
    ec.ncuda = 0;
    ec.nopencl = 0;
    if (em_init(&ec) != EM_OK) {
        fprintf(stderr, "ember convert: %s\n", em_last_error());
        return EM_TOOL_EXIT_RUNTIME;
    }
    int rc = EM_TOOL_EXIT_RUNTIME;
    tensor_list l = {0};
    if (read(in, rules, nrules, &l) == 0) {
        em_st_kv meta[1] = {{"format", l.format}};
        if (em_safetensors_save(out, (const char *const *)l.names, l.ts, l.n, meta, 1) != EM_OK) {
            fprintf(stderr, "ember convert: %s\n", em_last_error());
        } else {
            uint64_t bytes = 0;
            for (size_t i = 0; i < l.n; i++)
                bytes += (uint64_t)em_tensor_numel(l.ts[i]) * em_dtype_size(em_tensor_dtype(l.ts[i]));
            printf("%s -> %s: %zu tensors, %llu bytes\n", in, out, l.n, (unsigned long long)bytes);
            rc = 0;
        }
    }
    list_free(&l);
    em_shutdown();
    return rc;
}
