// --explain: each category's formula with this model's numbers, beside the measured bill and
// the lessons' claims (CLAIMS.md), so that a reader can redo the arithmetic.
#include "cli.h"

static void line(FILE *f, const char *name, uint64_t measured, uint64_t formula, const char *how) {
    char a[64], b[64];
    fprintf(f, "  %-10s measured %s\n             formula  %s = %s%s\n", name, mp_format_bytes(a, sizeof a, measured),
            how, mp_format_bytes(b, sizeof b, formula), measured == formula ? " (equal)" : "");
}

void cli_explain_train(FILE *f, const llama_config *c, long B, long T, optim_kind kind, ag_attention_kind att) {
    llama_closed_form cf;
    uint64_t per = optim_state_bytes_per_element(kind);
    llama_closed_form_compute(c, B, T, per, false, &cf);
    if (att != AG_ATTENTION_EAGER) llama_closed_form_flash(c, B, T, &cf);
    char how[256], x[64];
    unsigned long long P = (unsigned long long)cf.params;
    fprintf(f, "\nexplained (P = %llu parameters, batch %ld, %ld tokens, float32 = 4 bytes):\n", P, B, T);
    snprintf(how, sizeof how, "P x 4 = %llu x 4", P);
    line(f, "weight", mp_get_counter(MP_WEIGHT).peak, cf.weights, how);
    fprintf(f, "             allocated when the model is built or loaded; freed at the end of the run\n");
    line(f, "gradient", mp_get_counter(MP_GRADIENT).peak, cf.gradients, how);
    fprintf(
        f, "             one .grad per parameter, at its first accumulation in backward; set to none after the step\n");
    snprintf(how, sizeof how, "P x %llu = %llu x %llu%s", (unsigned long long)per, P, (unsigned long long)per,
             per == 8 ? " (exp_avg + exp_avg_sq)" : "");
    line(f, "optimizer", mp_get_counter(MP_OPTIMIZER).peak, cf.optimizer, how);
    fprintf(f, "             allocated at the first optimizer step, as torch.optim does; kept between steps\n");
    snprintf(how, sizeof how, "%lld blocks x %s + head %s", (long long)c->layers,
             mp_format_bytes(x, sizeof x, cf.act_per_block), "(norm, logits and their gradient)");
    line(f, "activation", mp_get_counter(MP_ACTIVATION).peak, cf.activations, how);
    if (cf.flash)
        fprintf(f,
                "             per block: the tensors its ops save for backward, growing with batch x tokens; flash\n"
                "             attention keeps a float32 log-sum-exp per query row (%s of each block here) where\n"
                "             eager keeps the probabilities, which grow with tokens squared\n",
                mp_format_bytes(x, sizeof x, cf.act_lse_per_block));
    else
        fprintf(f,
                "             per block: the tensors its ops save for backward, growing with batch x tokens, and\n"
                "             the attention probabilities with tokens squared (%s of each block here)\n",
                mp_format_bytes(x, sizeof x, cf.act_probs_per_block));
    fprintf(f,
            "  cache      none in training; inference keeps 2 x %lld layers x %lld kv heads x %lld x 4 = %llu bytes a "
            "token\n",
            (long long)c->layers, (long long)c->kv_heads, (long long)c->head_dim,
            (unsigned long long)(2 * c->layers * c->kv_heads * c->head_dim * 4));
    uint64_t four = cf.weights + cf.gradients + cf.optimizer;
    fprintf(f, "\n  the lessons' claims:\n");
    fprintf(f, "    training needs about four times the weights before activations: %.3f x here (%s)\n",
            (double)four / (double)cf.weights, mp_format_bytes(x, sizeof x, four));
    fprintf(f, "    SmolLM2-135M: 538 MB weights, 538 MB gradients, 1,076 MB Adam, 2,152 MB together\n");
    fprintf(f, "    a 70B model in float32 with Adam: 70e9 x 16 bytes = 1,120 GB before activations\n");
}
