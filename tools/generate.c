/* `ember generate`: text from a GPT checkpoint with a KV cache (issue #16,
 * item 5). The model is rebuilt from the checkpoint's "ember.model"
 * metadata (em_gpt2_config_format's text), its tokenizer named by
 * "ember.tokenizer"; the prompt is prefilled at once, then one token per
 * step (em_gpt2_generate), streamed to stdout. */
#include "tools/tools.h"

#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CMD "generate"

static void help(void)
{
    printf("usage: ember generate --checkpoint FILE [--prompt TEXT] [--max-new-tokens N]\n"
           "                      [--temperature T] [--top-k K] [--top-p P] [--seed S]\n"
           "                      [--stop TEXT] [--device DEV]\n\n"
           "Generates text with a GPT checkpoint written by 'ember train --model gpt': the\n"
           "model comes from its metadata (ember.model, a gpt:... configuration) and so does\n"
           "the tokenizer (ember.tokenizer; 'bytes' is the byte tokenizer, the only one\n"
           "supported here). The prompt goes through the model at once (prefill, filling a\n"
           "KV cache), then one token is drawn and fed per step. stdout gets the prompt and\n"
           "the generated text as it comes, then a newline; stderr the model and a summary\n"
           "(prompt and generated tokens, prefill time, decode tokens/s).\n\n"
           "  --checkpoint FILE     a checkpoint of 'ember train --model gpt' (required)\n"
           "  --prompt TEXT         the text to continue, at least one byte (default: a newline,\n"
           "                        as nanoGPT's sample.py)\n"
           "  --max-new-tokens N    tokens to generate, N >= 1 (default: fill the context,\n"
           "                        n_positions - prompt tokens). The KV cache holds n_positions\n"
           "                        positions and the context is not cropped: prompt + N above\n"
           "                        n_positions is an error (exit 2) naming the largest N\n"
           "  --temperature T       T >= 0; 0 = greedy (argmax); logits are divided by T (default 0.8)\n"
           "  --top-k K             keep the K most likely tokens, K >= 0, 0 = off (default 200)\n"
           "  --top-p P             nucleus sampling: the smallest set of most likely tokens whose\n"
           "                        probability reaches P, P in (0, 1], 1 = off (default 1)\n"
           "  --seed S              the sampler's seed, S >= 0 (default 1337): the same seed, checkpoint\n"
           "                        and options give the same text on every run\n"
           "  --stop TEXT           stop once the generated text contains TEXT (non-empty); TEXT\n"
           "                        and what follows it are not printed (the prompt is not searched)\n"
           "  --device DEV          cpu, cuda:N, opencl:N, auto (default: EMBER_DEVICE or cpu)\n\n"
           "Sampling is Hugging Face's (temperature, then top-k, then top-p, then a draw) with\n"
           "Ember's splitmix64 generator on the host (em_sample_logits in ember/nn.h); the\n"
           "defaults of temperature, top-k, seed and prompt are nanoGPT's sample.py.\n\n" EM_TOOL_EXIT_HELP);
}

/* stdout, token by token */
static int print_piece(int64_t id, const char *text, size_t n, void *ud)
{
    (void)id;
    (void)ud;
    if (n) fwrite(text, 1, n, stdout);
    fflush(stdout);
    return 0;
}

/* @p s for a message: backslash escapes for \n, \t, \\, ' and other bytes outside printable ASCII (\xNN) */
static const char *escaped(const char *s, char *buf, size_t n)
{
    size_t k = 0;
    for (; *s && k + 5 < n; s++) {
        const unsigned char ch = (unsigned char)*s;
        if (ch == '\n') k += (size_t)snprintf(buf + k, n - k, "\\n");
        else if (ch == '\t') k += (size_t)snprintf(buf + k, n - k, "\\t");
        else if (ch == '\\' || ch == '\'') k += (size_t)snprintf(buf + k, n - k, "\\%c", ch);
        else if (ch < 0x20 || ch >= 0x7f) k += (size_t)snprintf(buf + k, n - k, "\\x%02x", ch);
        else buf[k++] = (char)ch;
    }
    if (*s && k + 4 < n) k += (size_t)snprintf(buf + k, n - k, "...");
    buf[k < n ? k : n - 1] = 0;
    return buf;
}

static const char *tok_bytes(int64_t id, size_t *len, void *ud) { return em_tokenizer_token((const em_tokenizer *)ud, id, len); }

int em_tool_generate(int argc, char **argv)
{
    const char *ckpt = NULL, *prompt = "\n", *stop = NULL, *device = NULL;
    int64_t max_new = -1, top_k = 200, seed = 1337;
    double temperature = 0.8, top_p = 1.0;
    static const struct option opts[] = {{"checkpoint", required_argument, 0, 'c'},  {"prompt", required_argument, 0, 'p'},
                                         {"max-new-tokens", required_argument, 0, 'n'}, {"temperature", required_argument, 0, 't'},
                                         {"top-k", required_argument, 0, 'k'},       {"top-p", required_argument, 0, 'P'},
                                         {"seed", required_argument, 0, 's'},        {"stop", required_argument, 0, 'S'},
                                         {"device", required_argument, 0, 'D'},      {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":c:p:n:t:k:P:s:S:D:h", opts, NULL)) != -1) {
        switch (c) {
        case 'c': ckpt = optarg; break;
        case 'p': prompt = optarg; break;
        case 'n':
            if (em_tool_parse_i64(CMD, "--max-new-tokens", optarg, 1, (int64_t)1 << 40, &max_new)) return EM_TOOL_EXIT_USAGE;
            break;
        case 't':
            if (em_tool_parse_f64(CMD, "--temperature", optarg, 0, false, INFINITY, false, &temperature)) return EM_TOOL_EXIT_USAGE;
            break;
        case 'k': if (em_tool_parse_i64(CMD, "--top-k", optarg, 0, INT64_MAX, &top_k)) return EM_TOOL_EXIT_USAGE; break;
        case 'P': if (em_tool_parse_f64(CMD, "--top-p", optarg, 0, true, 1, false, &top_p)) return EM_TOOL_EXIT_USAGE; break;
        case 's': if (em_tool_parse_i64(CMD, "--seed", optarg, 0, INT64_MAX, &seed)) return EM_TOOL_EXIT_USAGE; break;
        case 'S': stop = optarg; break;
        case 'D': device = optarg; break;
        case 'h': help(); return 0;
        default: return em_tool_bad_option(CMD, c, argc, argv);
        }
    }
    if (em_tool_no_operands(CMD, argc, argv)) return EM_TOOL_EXIT_USAGE;
    if (!ckpt) {
        fprintf(stderr, "ember generate: --checkpoint FILE is required (see 'ember generate --help')\n");
        return EM_TOOL_EXIT_USAGE;
    }
    if (!*prompt) {
        fprintf(stderr, "ember generate: --prompt: the prompt is empty (the model needs at least one token to continue)\n");
        return EM_TOOL_EXIT_USAGE;
    }
    if (stop && !*stop) {
        fprintf(stderr, "ember generate: --stop: the stop string is empty\n");
        return EM_TOOL_EXIT_USAGE;
    }
    em_device dev;
    if (device && em_device_parse(device, &dev) != EM_OK) {
        fprintf(stderr, "ember generate: --device: %s\n", em_last_error());
        return EM_TOOL_EXIT_USAGE;
    }

    /* the checkpoint's metadata first: no runtime needed to refuse a wrong file */
    em_st_file *f = em_safetensors_open(ckpt);
    if (!f) {
        fprintf(stderr, "ember generate: %s\n", em_last_error());
        return EM_TOOL_EXIT_RUNTIME;
    }
    char spec[512] = "", tokname[128] = "";
    const char *ms = em_safetensors_metadata(f, "ember.model"), *ts = em_safetensors_metadata(f, "ember.tokenizer");
    int bad = 0;
    if (!ms) {
        fprintf(stderr, "ember generate: %s: no 'ember.model' metadata: not a checkpoint written by ember train\n", ckpt);
        bad = 1;
    } else if (strncmp(ms, "gpt:", 4) != 0) {
        fprintf(stderr, "ember generate: %s: the model is '%.200s' (metadata 'ember.model'), not a GPT (gpt:...): generate needs a "
                        "checkpoint of 'ember train --model gpt'\n", ckpt, ms);
        bad = 1;
    } else if (!ts) {
        fprintf(stderr, "ember generate: %s: no 'ember.tokenizer' metadata: the checkpoint does not say how its text is tokenized\n",
                ckpt);
        bad = 1;
    } else if (strcmp(ts, "bytes") != 0) {
        fprintf(stderr, "ember generate: %s: tokenizer '%.100s' (metadata 'ember.tokenizer') is not supported: only 'bytes' (the byte "
                        "tokenizer)\n", ckpt, ts);
        bad = 1;
    } else if (strlen(ms) >= sizeof spec) {
        fprintf(stderr, "ember generate: %s: metadata 'ember.model' is too long\n", ckpt);
        bad = 1;
    } else {
        snprintf(spec, sizeof spec, "%s", ms);
        snprintf(tokname, sizeof tokname, "%s", ts);
    }
    em_safetensors_close(f);
    if (bad) return EM_TOOL_EXIT_RUNTIME;
    em_gpt2_config cfg;
    if (em_gpt2_config_parse(spec, &cfg) != EM_OK) {
        fprintf(stderr, "ember generate: %s: metadata 'ember.model': %s\n", ckpt, em_last_error());
        return EM_TOOL_EXIT_RUNTIME;
    }
    em_tokenizer *tok = em_tokenizer_bytes();
    int64_t *ids = NULL;
    size_t n_ids = 0;
    if (!tok || em_tokenizer_encode(tok, prompt, strlen(prompt), &ids, &n_ids) != EM_OK) {
        fprintf(stderr, "ember generate: tokenizer: %s\n", em_last_error());
        em_tokenizer_free(tok);
        return EM_TOOL_EXIT_RUNTIME;
    }
    int rc = EM_TOOL_EXIT_USAGE;
    for (size_t i = 0; i < n_ids; i++)
        if (ids[i] >= cfg.vocab_size) {
            fprintf(stderr, "ember generate: --prompt: byte %zu of the prompt is token %lld, outside the model's vocabulary of %lld\n", i,
                    (long long)ids[i], (long long)cfg.vocab_size);
            goto out_tok;
        }
    const int64_t room = cfg.n_positions - (int64_t)n_ids;
    if (room < 1) {
        fprintf(stderr, "ember generate: --prompt: the prompt is %zu tokens, the model's context n_positions = %lld leaves no room for a "
                        "new token (at most %lld prompt tokens)\n", n_ids, (long long)cfg.n_positions, (long long)(cfg.n_positions - 1));
        goto out_tok;
    }
    if (max_new < 0) max_new = room;
    if (max_new > room) {
        fprintf(stderr, "ember generate: --max-new-tokens %lld: the prompt (%zu tokens) + %lld new tokens exceed the model's context "
                        "n_positions = %lld; give at most %lld (the KV cache does not crop the context)\n",
                (long long)max_new, n_ids, (long long)max_new, (long long)cfg.n_positions, (long long)room);
        goto out_tok;
    }

    rc = EM_TOOL_EXIT_RUNTIME;
    em_config ec = em_config_default();
    if (device) ec.device = device;
    if (em_init(&ec) != EM_OK) {
        fprintf(stderr, "ember generate: %s\n", em_last_error());
        goto out_tok;
    }
    em_module *m = em_gpt2_new(&cfg);
    if (!m) {
        fprintf(stderr, "ember generate: %s: metadata 'ember.model': %s\n", ckpt, em_last_error());
        goto out_rt;
    }
    if (em_checkpoint_load(ckpt, m, NULL, NULL, NULL) != EM_OK) {
        fprintf(stderr, "ember generate: %s\n", em_last_error());
        goto out_model;
    }
    em_module_train(m, false);
    char dn[32], sq[256];
    em_device_str(em_get_device(), dn, sizeof dn);
    fprintf(stderr,
            "ember generate: model %s (%lld parameters), tokenizer %s, device %s; temperature %g, top-k %lld, top-p %g, seed %lld%s%s%s\n",
            spec, (long long)em_module_num_params(m), tokname, dn, temperature, (long long)top_k, top_p, (long long)seed,
            stop ? ", stop '" : "", stop ? escaped(stop, sq, sizeof sq) : "", stop ? "'" : "");
    em_generate_opts o = em_generate_opts_default();
    o.max_new_tokens = max_new;
    o.sampling.temperature = temperature;
    o.sampling.top_k = top_k;
    o.sampling.top_p = top_p;
    o.seed = (uint64_t)seed;
    const int64_t tv = em_tokenizer_vocab_size(tok);
    o.vocab_limit = tv < cfg.vocab_size ? tv : 0; /* a padded vocabulary: only ids the tokenizer has */
    o.stop = stop;
    o.token_bytes = tok_bytes;
    o.token_bytes_ud = tok;
    o.on_token = print_piece;
    fwrite(prompt, 1, strlen(prompt), stdout);
    fflush(stdout);
    em_generate_result res;
    em_status st = em_gpt2_generate(m, ids, (int64_t)n_ids, &o, NULL, &res);
    fputc('\n', stdout);
    fflush(stdout);
    if (st != EM_OK) {
        fprintf(stderr, "ember generate: after %lld new tokens: %s\n", (long long)res.new_tokens, em_last_error());
        goto out_model;
    }
    const char *why = res.stopped == EM_GENERATE_STOP_STRING ? "the stop string" : "max-new-tokens";
    const int64_t dec = res.new_tokens - 1;
    fprintf(stderr, "ember generate: prompt %lld tokens, generated %lld tokens (stopped by %s); prefill %.1f ms (prompt forward + first "
                    "token); decode %lld tokens in %.3f s = %.1f tokens/s\n",
            (long long)res.prompt_tokens, (long long)res.new_tokens, why, 1e3 * res.prefill_s, (long long)dec, res.decode_s,
            dec > 0 && res.decode_s > 0 ? (double)dec / res.decode_s : 0.0);
    rc = 0;
out_model:
    em_module_free(m);
out_rt:
    em_shutdown();
out_tok:
    free(ids);
    em_tokenizer_free(tok);
    return rc;
}
