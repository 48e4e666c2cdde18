// --explain: each category's formula with this model's numbers, beside the measured bill and
// the lessons' claims (CLAIMS.md), so that a reader can redo the arithmetic.
#include "cli.h"

static void line(FILE *f, const char *name, uint64_t measured, uint64_t formula, const char *how) {
    char a[64], b[64];
    fprintf(f, "  %-10s measured %s\n             formula  %s = %s%s\n", name, mp_format_bytes(a, sizeof a, measured),
            how, mp_format_bytes(b, sizeof b, formula), measured == formula ? " (equal)" : "");
}

// The temporaries the optimizer's implementation keeps at most, from torch.optim's order
// (optim.h): for-loop Adam one parameter's sqrt and denom beside the previous one's denom,
// foreach every parameter's at once, fused none; *how gets the formula.
static uint64_t optimizer_temporaries(const llama_config *c, const optim_config *oc, char *how, size_t len) {
    bool adam = oc->kind == OPTIM_ADAM || oc->kind == OPTIM_ADAMW;
    bool l2 = oc->kind == OPTIM_ADAM && oc->weight_decay > 0;
    uint64_t most = 0, prev = 0, all = 0;
    for (size_t i = 0; i < llama_param_count_tensors(c); i++) {
        char name[LLAMA_PARAM_NAME_MAX];
        int nd;
        int64_t s[LLAMA_PARAM_MAX_DIMS];
        if (llama_param_spec(c, i, name, sizeof name, &nd, s) != 0) continue;
        uint64_t b = 4;
        for (int k = 0; k < LLAMA_PARAM_MAX_DIMS; k++) b *= (uint64_t)s[k];
        uint64_t need = prev + (l2 ? 3 : 2) * b;
        most = need > most ? need : most;
        prev = b, all += b;
    }
    if (!adam || oc->adam_impl == OPTIM_ADAM_FUSED) {
        snprintf(how, len, "%s keeps none", adam ? "fused Adam" : optim_kind_name(oc->kind));
        return 0;
    }
    if (oc->adam_impl == OPTIM_ADAM_FOREACH) {
        snprintf(how, len, "foreach Adam: sqrt(exp_avg_sq) of every parameter at once, the sum of P x 4");
        return all;
    }
    snprintf(how, len,
             "for-loop Adam: a parameter's sqrt and denom beside the previous one's denom, max of b(k-1) + %s",
             l2 ? "3 b(k)" : "2 b(k)");
    return most;
}

void cli_explain_train(FILE *f, const llama_config *c, long B, long T, const optim_config *oc, ag_framework fw,
                       ag_attention_kind att) {
    optim_kind kind = oc->kind;
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
    uint64_t act = mp_get_counter(MP_ACTIVATION).peak;
    line(f, "activation", act, cf.activations, how);
    if (fw != AG_FRAMEWORK_LEAN) // the formula is the lean saved set: say so, and what the difference is
        fprintf(
            f,
            "             the formula is --framework lean's (the tensors membill's fused ops save); this run bills\n"
            "             --framework %s, whose unfused ops keep %s%s more (their own outputs, casts and masks)\n",
            cli_framework_name(fw), act >= cf.activations ? "" : "-",
            mp_format_bytes(x, sizeof x, act >= cf.activations ? act - cf.activations : cf.activations - act));
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
    mp_counter tc = mp_get_counter(MP_TEMPORARY);
    uint64_t opt_tmp = optimizer_temporaries(c, oc, how, sizeof how), at_peak = mp_peak().bytes[MP_TEMPORARY];
    line(f, "temporary", tc.peak, opt_tmp, how);
    static cli_site_row rows[64];
    if (tc.peak && cli_breakdown(tc.peak_events, MP_TEMPORARY, rows, 64, NULL, 0))
        fprintf(f, "             at its own peak mostly %s (%s)\n", rows[0].kind,
                mp_format_bytes(x, sizeof x, rows[0].bytes));
    fprintf(
        f,
        "             scratch that is neither saved, nor a gradient, nor state: the optimizer's temporaries and the\n"
        "             autograd engine's out-of-place gradient sums; at the total peak it held %s, on top of\n"
        "             the four copies and the activations\n",
        mp_format_bytes(x, sizeof x, at_peak));
    char kf[160];
    fprintf(f, "  cache      none in training; inference keeps %s x 4 = %llu bytes a token\n",
            llama_kv_cache_formula(c, kf, sizeof kf), (unsigned long long)(llama_kv_cache_elems_per_token(c) * 4));
    uint64_t four = cf.weights + cf.gradients + cf.optimizer;
    fprintf(f, "\n  the lessons' claims:\n");
    fprintf(f, "    training needs about four times the weights before activations: %.3f x here (%s)\n",
            (double)four / (double)cf.weights, mp_format_bytes(x, sizeof x, four));
    fprintf(f, "    SmolLM2-135M: 538 MB weights, 538 MB gradients, 1,076 MB Adam, 2,152 MB together\n");
    fprintf(f, "    a 70B model in float32 with Adam: 70e9 x 16 bytes = 1,120 GB before activations\n");
}
