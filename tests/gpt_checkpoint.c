/* Writes a tiny GPT checkpoint for tests/e2e_generate.sh, laid out as
 * `ember train --model gpt` writes them: em_checkpoint_save's tensors
 * ("model.<key>") and progress metadata ("ember.format", ...), plus
 * "ember.model" = em_gpt2_config_format(config) and "ember.tokenizer" =
 * "bytes". Variants with missing or wrong metadata exercise the errors.
 *
 *   gpt_checkpoint OUT.safetensors KIND
 *
 * KIND: ok | no-model | no-tokenizer | tokenizer-bpe | mlp | bad-config |
 *       mismatch | small-vocab | padded-vocab | no-format
 * The model: vocab 256 (100 for small-vocab, 320 for padded-vocab: ids the
 * byte tokenizer does not have), n_positions 64, n_embd 32,
 * 2 layers, 4 heads, seed 3, the weights N(0, 0.3^2) (larger than GPT-2's
 * init, so the text depends on the prompt and the seed). */
#include "ember/ember.h"

#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: gpt_checkpoint OUT KIND\n");
        return 2;
    }
    const char *out = argv[1], *kind = argv[2];
    if (em_init(NULL) != EM_OK) {
        fprintf(stderr, "gpt_checkpoint: %s\n", em_last_error());
        return 1;
    }
    em_gpt2_config c = em_gpt2_config_default();
    c.vocab_size = !strcmp(kind, "small-vocab") ? 100 : !strcmp(kind, "padded-vocab") ? 320 : 256;
    c.n_positions = 64;
    c.n_embd = 32;
    c.n_layer = 2;
    c.n_head = 4;
    c.dropout = 0.0;
    em_manual_seed(3);
    em_module *m = em_gpt2_new(&c);
    int rc = 1;
    if (!m) goto out;
    em_tensor *ps[64];
    const int np = em_module_parameters(m, ps, 64);
    for (int i = 0; i < np; i++)
        if (em_tensor_ndim(ps[i]) == 2 && em_init_normal_(ps[i], 0.0, 0.3) != EM_OK) goto out;
    char spec[512];
    em_gpt2_config mc = c;
    if (!strcmp(kind, "mismatch")) mc.n_embd = 64; /* the metadata disagrees with the tensors */
    if (em_gpt2_config_format(&mc, spec, sizeof spec) != EM_OK) goto out;
    em_st_kv meta[3];
    size_t nm = 0;
    if (!strcmp(kind, "mlp")) meta[nm++] = (em_st_kv){"ember.model", "mlp:784-256-128-10"};
    else if (!strcmp(kind, "bad-config")) meta[nm++] = (em_st_kv){"ember.model", "gpt:vocab_size=abc"};
    else if (strcmp(kind, "no-model") != 0) meta[nm++] = (em_st_kv){"ember.model", spec};
    if (!strcmp(kind, "tokenizer-bpe")) meta[nm++] = (em_st_kv){"ember.tokenizer", "gpt2-bpe"};
    else if (strcmp(kind, "no-tokenizer") != 0) meta[nm++] = (em_st_kv){"ember.tokenizer", "bytes"};
    meta[nm++] = (em_st_kv){"ember.data", "tests/gpt_checkpoint.c"};
    em_status st;
    if (!strcmp(kind, "no-format")) { /* a plain SafeTensors file with the model metadata but no checkpoint keys */
        const char *names[64];
        char keys[64][128];
        for (int i = 0; i < np; i++) {
            snprintf(keys[i], sizeof keys[i], "p%d", i);
            names[i] = keys[i];
        }
        st = em_safetensors_save(out, names, ps, (size_t)np, meta, nm);
    } else {
        em_checkpoint_info info = {0};
        st = em_checkpoint_save(out, m, NULL, NULL, &info, meta, nm);
    }
    if (st == EM_OK) rc = 0;
out:
    if (rc) fprintf(stderr, "gpt_checkpoint: %s\n", em_last_error());
    em_module_free(m);
    em_shutdown();
    return rc;
}
