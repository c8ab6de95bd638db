/* The `ember` command-line program. */
#include "tools/tools.h"

#include <getopt.h>
#include <stdio.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ember <command> [options]\n\n"
            "commands:\n"
            "  train       train a classifier on Fashion-MNIST (the main job)\n"
            "  eval        evaluate a checkpoint: loss, accuracy, confusion matrix\n"
            "  predict     predicted classes with probabilities for chosen test images\n"
            "  generate    generate text with a GPT checkpoint (KV cache, temperature, top-k, top-p)\n"
            "  serve       serve a model repository over HTTP (KServe v2 protocol, dynamic batching, CPU + GPUs)\n"
            "  run         run an ONNX model on .npy inputs and print its outputs\n"
            "  convert     convert a PyTorch checkpoint (.pt / .pth) or an ONNX model's weights to SafeTensors\n"
            "  plot        draw (or overlay) runs' loss and accuracy curves from their metrics.csv\n"
            "  devices     list workers, devices, memory nodes and the hwloc topology\n"
            "  version     print the version\n\n"
            "Run 'ember <command> --help' for a command's options.\n\n" EM_TOOL_EXIT_HELP);
}

/* The options of a command that takes none but --help: -1 to go on, else the
 * exit status (0 after printing @p help, 2 for anything else). */
static int only_help(const char *cmd, int argc, char **argv, const char *help)
{
    static const struct option opts[] = {{"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        if (c != 'h') return em_tool_bad_option(cmd, c, argc, argv);
        fputs(help, stdout);
        return 0;
    }
    return em_tool_no_operands(cmd, argc, argv) ? EM_TOOL_EXIT_USAGE : -1;
}

static int cmd_devices(int argc, char **argv)
{
    int rc = only_help("devices", argc, argv,
                       "usage: ember devices\n\nLists StarPU workers (CPU cores, GPUs, OpenCL devices), how each OpenCL\n"
                       "device holds f16/bf16 (and whether it has cl_khr_fp16), memory nodes and the\n"
                       "hwloc topology. EMBER_DEVICE, EMBER_NCPU, EMBER_NCUDA, EMBER_NOPENCL and\n"
                       "EMBER_SCHED are honoured.\n\n" EM_TOOL_EXIT_HELP);
    if (rc >= 0) return rc;
    if (em_init(NULL) != EM_OK) {
        fprintf(stderr, "ember devices: %s\n", em_last_error());
        return 1;
    }
    em_print_devices(stdout);
    em_shutdown();
    return 0;
}

static int cmd_version(int argc, char **argv)
{
    int rc = only_help("version", argc, argv, "usage: ember version\n\nPrints the version.\n\n" EM_TOOL_EXIT_HELP);
    if (rc >= 0) return rc;
    printf("ember %s\n", EMBER_VERSION_STRING);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) { /* a usage error: the usage goes to stderr */
        usage(stderr);
        return EM_TOOL_EXIT_USAGE;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "devices")) return cmd_devices(argc - 1, argv + 1);
    if (!strcmp(cmd, "train")) return em_tool_train(argc - 1, argv + 1);
    if (!strcmp(cmd, "eval")) return em_tool_eval(argc - 1, argv + 1);
    if (!strcmp(cmd, "predict")) return em_tool_predict(argc - 1, argv + 1);
    if (!strcmp(cmd, "generate")) return em_tool_generate(argc - 1, argv + 1);
    if (!strcmp(cmd, "serve")) return em_tool_serve(argc - 1, argv + 1);
    if (!strcmp(cmd, "run")) return em_tool_run(argc - 1, argv + 1);
    if (!strcmp(cmd, "plot")) return em_tool_plot(argc - 1, argv + 1);
    if (!strcmp(cmd, "convert")) return em_tool_convert(argc - 1, argv + 1);
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) return cmd_version(argc - 1, argv + 1);
    fprintf(stderr, "ember: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 2;
}
