// membill plan's report: the bill beside its closed form, per device, the fit, as text and JSON.
#include "plan.h"

#include <stdlib.h>
#include <string.h>

#define TEMPORARY_TEXT "scratch neither saved, nor a gradient, nor state (optimizer temporaries, gradient sums)"

static void row(FILE *out, const char *name, uint64_t measured, uint64_t closed, const char *formula) {
    char a[64], b[64];
    fprintf(out, "  %-11s %-36s %-36s %s\n", name, mp_format_bytes(a, sizeof a, measured),
            closed ? mp_format_bytes(b, sizeof b, closed) : "(measured only)", formula);
}

// An adapter element's bytes as weight, gradient and optimizer state: the run's, or the adapters'
// own dtype (PEFT's float32) in every state.
static void lora_element_bytes(const llama_lora_closed_form *lf, uint64_t *w, uint64_t *g, uint64_t *k) {
    const uint64_t A = lf->adapter_params ? lf->adapter_params : 1;
    *w = lf->adapter_weights / A, *g = lf->gradients / A, *k = lf->optimizer / A;
}

// The closed form's element sizes for the setting.
llama_dtype_bytes plan_dtype_bytes(const plan_setting *s) {
    optim_config own = s->ocfg; // a float32 parameter's own state (PEFT's float32 adapters)
    own.state_bits = 32, own.master = false;
    llama_dtype_bytes d = {(uint64_t)s->dt.weight_bits / 8, (uint64_t)s->dt.grad_bits / 8, (uint64_t)s->dt.act_bits / 8,
                           optim_state_bytes(&s->ocfg), optim_state_bytes(&own)};
    return d;
}

// The exact weight bytes of an inference setting (quantised matrices, norms in the compute dtype).
static uint64_t infer_weight_bytes(const plan_setting *s) {
    return llama_weight_bytes(&s->cfg, s->dt.weight_bits, s->dt.group, s->dt.scale_bytes, s->dt.act_bits);
}

// Tokens the cache holds at the end: the prompt, and every new token but the last (only chosen).
long plan_cache_tokens(const plan_setting *s) { return s->seq_len + s->new_tokens - 1; }

// The routed experts' parameters of every sparse layer (all the experts, whatever --ep).
static uint64_t expert_params(const llama_config *c) {
    uint64_t e = 0;
    for (size_t i = 0, n = llama_param_count_tensors(c); i < n; i++) {
        llama_param_info p;
        if (llama_param_info_of(c, i, &p) != 0 || p.expert < 0 || p.buffer) continue;
        uint64_t k = 1;
        for (int d = 0; d < p.ndim; d++) k *= (uint64_t)p.shape[d];
        e += k;
    }
    return e;
}

// Under --ep the rank holds the dense parameters D and its experts' X = E / ep; the sharded
// states are split over N for D and over the M = N / ep ranks of its expert-data-parallel group
// for X: stage 0 (w+g+K)(D+X); 1 (w+g)(D+X) + K(D/N + X/M); 2 w(D+X) + (g+K)(D/N + X/M);
// 3 (w+g+K)(D/N + X/M).
static uint64_t zero_formula_ep(const plan_setting *s, const llama_dtype_bytes *d, uint64_t P, char *text, size_t len) {
    static const char *const forms[] = {
        "(%llu + %llu + K)(Psi_d + Psi_e)", "(%llu + %llu)(Psi_d + Psi_e) + K(Psi_d/N + Psi_e/M)",
        "%llu(Psi_d + Psi_e) + (%llu + K)(Psi_d/N + Psi_e/M)", "(%llu + %llu + K)(Psi_d/N + Psi_e/M)"};
    const uint64_t N = (uint64_t)s->gpus, M = N / (uint64_t)s->ep, X = expert_params(&s->cfg) / (uint64_t)s->ep,
                   D = P - X * (uint64_t)s->ep, w = d->weight, g = d->gradient, k = d->optimizer;
    int at = snprintf(text, len, forms[s->zero], (unsigned long long)w, (unsigned long long)g);
    if (at > 0 && (size_t)at < len)
        snprintf(text + at, len - (size_t)at,
                 ", K = %llu, Psi_d = %llu dense parameters, Psi_e = %llu of this rank's experts, M = N / ep = %llu",
                 (unsigned long long)k, (unsigned long long)D, (unsigned long long)X, (unsigned long long)M);
    switch (s->zero) {
    case 0: return (w + g + k) * (D + X);
    case 1: return (w + g) * (D + X) + k * D / N + k * X / M;
    case 2: return w * (D + X) + (g + k) * D / N + (g + k) * X / M;
    default: return (w + g + k) * D / N + (w + g + k) * X / M;
    }
}

// ZeRO's model states a device holds (ZeRO paper, section 5: Psi parameters, K bytes of
// optimizer state each, N devices): stage 0 (w+g+K)Psi; 1 wPsi + gPsi + KPsi/N; 2 wPsi +
// (g+K)Psi/N; 3 (w+g+K)Psi/N. The paper's mixed-precision Adam has w = g = 2, K = 12.
static uint64_t zero_formula(const plan_setting *s, const llama_dtype_bytes *dt, uint64_t P, char *text, size_t len) {
    if (s->ep > 1 && !s->lora.cfg.rank && !s->infer && !s->fsdp) return zero_formula_ep(s, dt, P, text, len);
    llama_dtype_bytes fsdp = *dt; // FSDP's mixed precision: float32 shards and gradient shards, no master
    if (s->fsdp && s->dt.master) fsdp.weight = 4, fsdp.gradient = 4, fsdp.optimizer -= 4;
    const llama_dtype_bytes *d = s->fsdp ? &fsdp : dt;
    uint64_t w = d->weight * P, g = d->gradient * P, k = d->optimizer * P, N = (uint64_t)s->gpus;
    int stage = s->fsdp ? 3 : (int)s->zero;
    static const char *const forms[] = {"(%llu + %llu + K)Psi, K = %llu", "%lluPsi + %lluPsi + KPsi/N, K = %llu",
                                        "%lluPsi + (%llu + K)Psi/N, K = %llu", "(%llu + %llu + K)Psi/N, K = %llu"};
    snprintf(text, len, forms[stage], (unsigned long long)d->weight, (unsigned long long)d->gradient,
             (unsigned long long)d->optimizer);
    if (s->lora.cfg.rank && !s->infer) { // what trains is the adapters (A parameters); the base is B bytes
        static const char *const lora_forms[] = {
            "B + (%llu + %llu + K)A, K = %llu, A = %llu adapter parameters, B = the frozen base's %llu bytes",
            "B + %lluA + %lluA + KA/N, K = %llu, A = %llu adapter parameters, B = the frozen base's %llu bytes",
            "B + %lluA + (%llu + K)A/N, K = %llu, A = %llu adapter parameters, B = the frozen base's %llu bytes",
            "(B + (%llu + %llu + K)A)/N, K = %llu, A = %llu adapter parameters, B = the frozen base's %llu bytes"};
        llama_lora_closed_form lf;
        plan_setting rank = *s; // --ep: the frozen base of the rank, its own experts
        if (s->ep > 1) rank.cfg.moe.ep = s->ep;
        plan_lora_closed_form(&rank, &lf);
        const uint64_t A = lf.adapter_params;
        uint64_t aw, ag, ak;
        lora_element_bytes(&lf, &aw, &ag, &ak);
        w = lf.base_weights + aw * A, g = ag * A, k = ak * A;
        snprintf(text, len, lora_forms[stage], (unsigned long long)aw, (unsigned long long)ag, (unsigned long long)ak,
                 (unsigned long long)lf.adapter_params, (unsigned long long)lf.base_weights);
    }
    switch (stage) {
    case 0: return w + g + k;
    case 1: return w + g + k / N;
    case 2: return w + (g + k) / N;
    default: return (w + g + k) / N;
    }
}

static void text_states(FILE *out, const plan_view *v) {
    const plan_setting *s = v->s;
    const plan_bill *b = v->b;
    char f[200], x[64], y[64];
    unsigned long long P = (unsigned long long)v->cf->params;
    llama_dtype_bytes d = plan_dtype_bytes(s);
    const unsigned long long buf = (unsigned long long)(v->cf->weights / d.weight) - P; // deepseek_v3's buffers
    int nw = snprintf(f, sizeof f, "P x %llu = %llu x %llu (%s)", (unsigned long long)d.weight, P,
                      (unsigned long long)d.weight, s->dt.weight_bits == 32 ? "float32" : "16-bit");
    if (buf && nw > 0 && (size_t)nw < sizeof f)
        snprintf(f + nw, sizeof f - (size_t)nw, ", + %llu x %llu (buffers: e_score_correction_bias)", buf,
                 (unsigned long long)d.weight);
    row(out, "weight", b->peak[MP_WEIGHT], v->cf->weights, f);
    // a routing that leaves experts without tokens: P' and P'' the parameters some token reached
    bool idle = v->cf->grad_params != v->cf->params || v->cf->state_params != v->cf->params;
    if (idle)
        snprintf(f, sizeof f, "P' x %llu, P' = %llu of P with a gradient (an expert no token reached has none)",
                 (unsigned long long)d.gradient, (unsigned long long)v->cf->grad_params);
    else
        snprintf(f, sizeof f, "P x %llu%s", (unsigned long long)d.gradient,
                 s->dt.grad_bits > s->dt.weight_bits ? " (float32 main_grad beside 16-bit weights)"
                                                     : ", the size of the weights");
    row(out, "gradient", b->peak[MP_GRADIENT], v->cf->gradients, f);
    int states = (int)(optim_state_bytes_per_element(s->ocfg.kind) / sizeof(float)), sb = s->dt.state_bits / 8;
    int n = idle ? snprintf(f, sizeof f,
                            "P'' = %llu with a gradient in some step: ", (unsigned long long)v->cf->state_params)
                 : 0;
    snprintf(f + n, sizeof f - (size_t)n, "%s x %llu (%s%s%s)", idle ? "P''" : "P", (unsigned long long)d.optimizer,
             s->ocfg.master && states ? "fp32 master 4 + "
             : s->ocfg.master         ? "fp32 master 4"
                                      : "",
             states == 2 ? (sb == 4 ? "exp_avg 4 + exp_avg_sq 4" : "exp_avg 2 + exp_avg_sq 2, in the parameters' dtype")
             : states == 1 ? (sb == 4 ? "momentum_buffer 4" : "momentum_buffer 2")
                           : "",
             !states && !s->ocfg.master ? "no state" : "");
    row(out, "optimizer", b->peak[MP_OPTIMIZER], v->cf->optimizer, f);
    if (s->checkpointing)
        snprintf(f, sizeof f, "%lld block inputs (%s) + the larger of the head and one block recomputed (%s)",
                 (long long)s->cfg.layers, mp_format_bytes(x, sizeof x, v->cf->act_block_inputs),
                 mp_format_bytes(y, sizeof y, v->cf->act_recompute));
    else
        snprintf(f, sizeof f, "%lld blocks x %s (attention %s %s of it) + head", (long long)s->cfg.layers,
                 mp_format_bytes(x, sizeof x, v->cf->act_per_block),
                 v->cf->flash ? "log-sum-exp rows" : "probabilities",
                 mp_format_bytes(y, sizeof y, v->cf->flash ? v->cf->act_lse_per_block : v->cf->act_probs_per_block));
    if (v->cf->moe_blocks && !s->checkpointing) {
        char z[64];
        int64_t d = (int64_t)v->cf->act_moe_delta;
        snprintf(f, sizeof f,
                 "%lld blocks x %s, %lld of them sparse (%s%s each: router, routing, experts' gate and up), "
                 "balanced routing; peak at %s",
                 (long long)s->cfg.layers, mp_format_bytes(x, sizeof x, v->cf->act_per_block),
                 (long long)v->cf->moe_blocks, d < 0 ? "-" : "+",
                 mp_format_bytes(y, sizeof y, (uint64_t)(d < 0 ? -d : d)),
                 v->cf->activations == v->cf->act_experts_moment
                     ? "the last sparse block's experts backward"
                     : (snprintf(z, sizeof z, "the head (%s)", mp_format_bytes(z + 32, 32, v->cf->act_head)), z));
    }
    if (!v->cf->closed) snprintf(f, sizeof f, "a sparse block's recomputation and backward are not closed");
    row(out, "activation", b->peak[MP_ACTIVATION], v->cf->closed ? v->cf->activations : 0, f);
    row(out, "temporary", b->peak[MP_TEMPORARY], 0, TEMPORARY_TEXT);
    fprintf(out, "  %-11s %-36s step 2, the steady state (%sgradients set to none); step 1 peak %s\n", "total peak",
            mp_format_bytes(x, sizeof x, b->total), b->peak[MP_OPTIMIZER] ? "optimizer state kept, " : "",
            mp_format_bytes(y, sizeof y, b->first_step));
    uint64_t states_bytes = b->peak[MP_WEIGHT] + b->peak[MP_GRADIENT] + b->peak[MP_OPTIMIZER];
    cli_above_four_copies_text(out, "  ", b->total, b->at_peak, states_bytes, b->peak_events);
    if (v->other) {
        int64_t d = (int64_t)v->other->total - (int64_t)b->total;
        fprintf(out, "  with --attention %s instead: total peak %s (%s%s), activations at their peak %s\n",
                cli_attention_name(plan_other_attention(s->attention)), mp_format_bytes(x, sizeof x, v->other->total),
                d < 0 ? "-" : "+", mp_format_bytes(y, sizeof y, (uint64_t)(d < 0 ? -d : d)),
                mp_format_bytes(f, sizeof f, v->other->peak[MP_ACTIVATION]));
    }
    char sum[64];
    cli_dtype_bytes_text(&s->dt, s->ocfg.kind, sum, sizeof sum);
    unsigned long long per = (unsigned long long)(d.weight + d.gradient + d.optimizer);
    fprintf(out, "\n  bytes a parameter before activations: %s = %llu", sum, per);
    if (s->dt.master && s->dt.grad_bits == 16)
        fprintf(
            out,
            " (mixed precision: 16-bit weights and gradients for the\n  forward and backward, a float32 master copy "
            "and "
            "float32 Adam state for the update: DeepSpeed's 2 + 2 + 12 = 16;\n  Megatron-LM accumulates gradients in a "
            "float32 main_grad: 2 + 4 + 12 = 18, --dtype bf16-mixed-fp32-grads)");
    else if (s->dt.master)
        fprintf(
            out,
            " (Megatron-LM's count: 16-bit weights, gradients accumulated\n  in a float32 main_grad, a float32 master "
            "copy and float32 Adam state: 2 + 4 + 12 = 18; DeepSpeed keeps 16-bit\n  gradients: 2 + 2 + 12 = 16, "
            "--dtype bf16-mixed)");
    fprintf(out,
            "\n  activations at %s, except RMSNorm's rstd and the loss's log-sum-exp rows, float32 as autocast keeps "
            "them\n",
            s->dt.act_bits == 32 ? "float32" : "16 bits");
    fprintf(out,
            "\n  lesson claim T7: 70e9 parameters x 16 bytes = 1,120 GB before activations;\n"
            "  this model, %s: %llu x %llu = %s before activations, %s with them (batch %ld x %ld)\n",
            s->dt.long_name, P, per, mp_format_bytes(x, sizeof x, P * per),
            mp_format_bytes(y, sizeof y, P * per + b->peak[MP_ACTIVATION]), s->batch, s->seq_len);
    if (idle)
        fprintf(out, "  (measured here %s before activations: the routing leaves experts without tokens)\n",
                mp_format_bytes(x, sizeof x, states_bytes));
}

// DeepSpeed's "largest layer" (estimate_zero3_model_states_mem_needs_all_live): the most
// parameters one module holds itself; a Llama's modules hold a weight, and maybe its bias.
static uint64_t largest_layer(const llama_config *c) {
    uint64_t best = 0;
    size_t n = llama_param_count_tensors(c);
    for (size_t i = 0; i < n; i++) {
        char name[LLAMA_PARAM_NAME_MAX], next[LLAMA_PARAM_NAME_MAX];
        int ndim, nd2;
        int64_t shape[LLAMA_PARAM_MAX_DIMS], sh2[LLAMA_PARAM_MAX_DIMS];
        if (llama_param_spec(c, i, name, sizeof name, &ndim, shape) != 0) continue;
        uint64_t k = (uint64_t)shape[0] * (uint64_t)shape[1] * (uint64_t)shape[2];
        size_t len = strlen(name);
        if (len > 7 && strcmp(name + len - 7, ".weight") == 0 && i + 1 < n &&
            llama_param_spec(c, i + 1, next, sizeof next, &nd2, sh2) == 0 && strncmp(next, name, len - 7) == 0 &&
            strcmp(next + len - 7, ".bias") == 0)
            k += (uint64_t)sh2[0];
        if (k > best) best = k;
    }
    return best;
}

// DeepSpeed's estimators of one GPU's model states, in their fp16 mixed-precision bytes whatever
// the dtype: estimate_zero2_model_states_mem_needs (stages 1 and 2), 4P + 16P/N; and
// estimate_zero3_model_states_mem_needs, 4 x largest layer + 18P/N. 0 for stage 0 (none).
static uint64_t deepspeed_formula(const plan_setting *s, uint64_t P, char *text, size_t len) {
    uint64_t N = (uint64_t)s->gpus;
    if (s->fsdp) {
        snprintf(text, len, "none for FSDP (DeepSpeed's estimators are ZeRO's)");
        return 0;
    }
    if (s->ep > 1) {
        snprintf(text, len, "none for --ep (its estimators take one data-parallel group, not the experts' own)");
        return 0;
    }
    if (s->lora.cfg.rank && s->zero > 0) { // the frozen base B at its own bytes, the adapters A in its terms
        llama_lora_closed_form lf;
        plan_lora_closed_form(s, &lf);
        uint64_t A = lf.adapter_params, B = lf.base_weights, L = largest_layer(&s->cfg);
        double per = lf.base_params ? (double)B / (double)lf.base_params : 0; // bytes of a frozen parameter
        if (s->zero < 3) {
            snprintf(text, len,
                     "estimate_zero2_model_states_mem_needs with a frozen base: B + 4A + 16A/N, A = %llu, "
                     "B = %llu bytes",
                     (unsigned long long)A, (unsigned long long)B);
            return B + 4 * A + 16 * A / N;
        }
        uint64_t layer = (uint64_t)(2.0 * per * (double)L);
        snprintf(text, len,
                 "estimate_zero3_model_states_mem_needs with a frozen base: 2 x the largest layer's %llu "
                 "parameters at the base's bytes + (B + 18A)/N, A = %llu, B = %llu bytes",
                 (unsigned long long)L, (unsigned long long)A, (unsigned long long)B);
        return layer + (B + 18 * A) / N;
    }
    if (s->zero == 0) {
        snprintf(text, len, "none for stage 0 (DDP keeps 16P in its terms)");
        return 0;
    }
    if (s->zero < 3) {
        snprintf(text, len, "estimate_zero2_model_states_mem_needs: 4P + 16P/N");
        return 4 * P + 16 * P / N;
    }
    uint64_t L = largest_layer(&s->cfg);
    snprintf(text, len, "estimate_zero3_model_states_mem_needs: 4 x largest layer (%llu) + 18P/N",
             (unsigned long long)L);
    return 4 * L + 18 * P / N;
}

static const char *const paper_why =
    "model states alone, at this dtype's sizes: no activations, no buckets, no gathered blocks";
static const char *const deepspeed_why[] = {
    "",
    "fp16 weights and gradients whole (4P), fp32 master, moments and a gradient partition sharded (16P/N): "
    "its own mixed precision whatever --dtype, nothing for activations or buckets",
    "fp16 weights and gradients whole (4P), fp32 master, moments and a gradient partition sharded (16P/N): "
    "its own mixed precision whatever --dtype, nothing for activations or buckets",
    "an fp16 shard, an fp32 gradient partition and fp32 state (2 + 4 + 12 = 18P/N) and the largest layer's "
    "gathered fp16 parameters twice (4 x), in its own mixed precision; this rank gathers whole blocks, prefetched, "
    "and reduces in buckets"};

static const char *deepspeed_why_of(const plan_setting *s) {
    if (!s->lora.cfg.rank) return deepspeed_why[s->zero];
    return s->zero < 3 ? "its estimator with the frozen base whole at its own bytes (B) and the adapters in its mixed "
                         "precision (4A whole, 16A/N sharded); nothing for activations or buckets"
                       : "its estimator with the frozen base sharded at its own bytes (B/N), the adapters' 18A/N and "
                         "the largest layer gathered twice; this rank gathers whole blocks, prefetched";
}

static void text_collectives(FILE *out, const par_stats *st) {
    char x[64];
    fprintf(out, "    collectives a step:");
    for (int k = 0; k < PAR_NCOLLECTIVES; k++)
        fprintf(out, "%s %s %llu x, %s", k ? ";" : "", par_collective_name(k),
                (unsigned long long)(st->calls[k] / PLAN_STEPS_BILLED),
                mp_format_bytes(x, sizeof x, st->bytes[k] / PLAN_STEPS_BILLED));
    fprintf(out, "\n");
}

static void text_per_gpu(FILE *out, const plan_view *v) {
    const plan_setting *s = v->s;
    const gpu_share *g = v->g;
    char x[64], y[64], f[256];
    llama_dtype_bytes d = plan_dtype_bytes(s);
    if (v->b->simulated_rank)
        fprintf(out,
                "\n  per device (%ld GPU%s, %s%s%s, batch %ld each%s): a simulated rank's own bill, rank 0 of %ld\n"
                "  running membill train --zero's step on shapes (its shards, buckets and gathered blocks; the "
                "collectives\n  counted, not run), at its steady-state peak (step 2, phase %s):\n",
                s->gpus, s->gpus > 1 ? "s" : "", plan_strategy_name(s), s->offload ? ", offload " : "",
                s->offload ? par_offload_name((par_offload)s->offload) : "", s->batch,
                s->grad_accum > 1 ? ", gradients accumulated over micro-batches" : "", s->gpus,
                mp_phase_name(g->phase));
    else
        fprintf(out, "\n  one device: the whole bill at its steady-state peak (step 2, phase %s):\n",
                mp_phase_name(g->phase));
    const char *names[] = {"weights", "gradients", "optimizer", "activations", "temporary", "overhead allowance"};
    const uint64_t vals[] = {g->weights, g->gradients, g->optimizer, g->activations, g->temporary, g->overhead};
    for (int i = 0; i < 6; i++) fprintf(out, "    %-19s %s\n", names[i], mp_format_bytes(x, sizeof x, vals[i]));
    fprintf(out, "    %-19s %s%s\n", "total", mp_format_bytes(x, sizeof x, g->total),
            v->b->dev_oom ? " at least (the card ran out before the peak)" : "");
    if (s->offload) { // the rank's host memory, apart from the device's total
        fprintf(out, "    host memory (offload, each category at its own peak): %s",
                mp_format_bytes(x, sizeof x, g->host_total));
        for (int c = 0; c < MP_NCATEGORIES; c++)
            if (g->host[c])
                fprintf(out, ";\n      %s %s", mp_category_name(c), mp_format_bytes(x, sizeof x, g->host[c]));
        fprintf(out, "\n");
    }
    const uint64_t *own = g->own_peak;
    uint64_t states = own[MP_WEIGHT] + own[MP_GRADIENT] + own[MP_OPTIMIZER];
    fprintf(out, "    each at its own peak: weights %s, gradients ", mp_format_bytes(x, sizeof x, own[MP_WEIGHT]));
    fprintf(out, "%s,\n      optimizer ", mp_format_bytes(x, sizeof x, own[MP_GRADIENT]));
    fprintf(out, "%s, temporary ", mp_format_bytes(x, sizeof x, own[MP_OPTIMIZER]));
    fprintf(out, "%s\n", mp_format_bytes(x, sizeof x, own[MP_TEMPORARY]));
    if (v->b->simulated_rank) text_collectives(out, &v->b->comm);
    uint64_t formula = zero_formula(s, &d, v->cf->params, f, sizeof f);
    fprintf(out, "    model states at their own peaks %s\n", mp_format_bytes(x, sizeof x, states));
    fprintf(out, "      ZeRO paper's %s, N = %ld: %s\n        (%s)\n", f, s->gpus,
            mp_format_bytes(y, sizeof y, formula), paper_why);
    uint64_t ds = deepspeed_formula(s, v->cf->params, f, sizeof f);
    if (ds)
        fprintf(out, "      DeepSpeed's %s: %s\n        (%s)\n", f, mp_format_bytes(y, sizeof y, ds),
                deepspeed_why_of(s));
    else
        fprintf(out, "      DeepSpeed: %s\n", f);
}

static bool fits_device(const plan_view *v) { return v->g->total <= v->device && !v->b->dev_oom; }

const char *plan_device_text(char *buf, size_t len, uint64_t bytes) {
    char c[32];
    double gib = (double)bytes / 1073741824.0;
    if (bytes % 1073741824ULL == 0)
        snprintf(buf, len, "%llu GiB (%.2f GB, %s bytes)", (unsigned long long)(bytes >> 30), (double)bytes / 1e9,
                 cli_commas(c, sizeof c, bytes));
    else
        snprintf(buf, len, "%.2f GiB (%.2f GB, %s bytes)", gib, (double)bytes / 1e9, cli_commas(c, sizeof c, bytes));
    return buf;
}

static void text_suggestions(FILE *out, const plan_view *v) {
    char x[64];
    if (!v->nsuggestions) {
        fprintf(out, "  no setting of up to four changes (dtype, flash attention, checkpointing, LoRA, QLoRA, ZeRO-3, "
                     "offload, batch) fits either\n");
        return;
    }
    fprintf(out, "  what would fit, each measured by the same meta run (the smallest change first):\n");
    for (int i = 0; i < v->nsuggestions; i++) {
        const plan_suggestion *g = &v->suggestions[i];
        fprintf(out, "   ");
        for (int k = 0; k < g->n; k++) fprintf(out, " %s", g->options[k]);
        fprintf(out, ": %s a device\n", mp_format_bytes(x, sizeof x, g->total));
    }
}

static void text_limits(FILE *out, const plan_view *v);

static void text_fit(FILE *out, const plan_view *v) {
    char x[96], y[64];
    const plan_setting *s = v->s;
    if (s->dev.cuda) // the device's own lines said it; the overhead allowance is what they leave out
        fprintf(out, "\n  on the %s (%s): %s\n", s->dev.gpu ? s->dev.gpu->name : "device",
                plan_device_text(x, sizeof x, v->device), fits_device(v) ? "fits" : "does NOT fit");
    else
        fprintf(out, "\n  on a %s device, with %s of framework overhead (the lesson's \"1 to 2 GB\"; --overhead): %s\n",
                plan_device_text(x, sizeof x, v->device), mp_format_bytes(y, sizeof y, s->overhead),
                fits_device(v) ? "fits" : "does NOT fit");
    if (!v->searched) {
        fprintf(out, "  (with --seq-lens the largest batch and longest length are not searched)\n");
        return;
    }
    if (v->max_batch == 0 && v->max_seq == 0)
        fprintf(out, "  nothing fits: even batch 1 x %d token%s needs %s on one device\n", s->infer ? 1 : 2,
                s->infer ? "" : "s", mp_format_bytes(x, sizeof x, v->smallest));
    else
        text_limits(out, v);
    if (!fits_device(v) && !s->infer) text_suggestions(out, v);
}

// The largest batch and the longest sequence that fit the device.
static void text_limits(FILE *out, const plan_view *v) {
    const plan_setting *s = v->s;
    if (v->max_batch == 0)
        fprintf(out, "  no batch fits at %ld tokens", s->seq_len);
    else
        fprintf(out, "  largest batch at %ld tokens: %s%ld%s", s->seq_len, v->batch_capped ? "at least " : "",
                v->max_batch, v->batch_capped ? " (the search stops there)" : "");
    if (v->max_seq == 0)
        fprintf(out, "; no length fits at batch %ld\n", s->batch);
    else
        fprintf(out, "; longest %s at batch %ld: %ld tokens%s\n", s->infer ? "prompt" : "sequence", s->batch,
                v->max_seq,
                v->seq_capped ? ", the model's positions (max_position_embeddings), not memory, are the limit" : "");
}

// LoRA's closed form of the model states for the setting.
void plan_lora_closed_form(const plan_setting *s, llama_lora_closed_form *lf) {
    llama_dtype_bytes d = plan_dtype_bytes(s);
    ag_precision base;
    bool q = cli_lora_base_dtype(&s->lora, &s->dt, &base);
    llama_closed_form_lora(&s->cfg, &s->lora.cfg, &d, q ? base.weight_bits : s->dt.weight_bits, q ? base.group : 0,
                           q ? base.scale_bytes : 0, q && base.nf4, lf);
}

// LoRA's activation peak in closed form for the setting (closed false where it does not follow it).
void plan_lora_act_form(const plan_setting *s, llama_lora_act_form *af) {
    llama_dtype_bytes d = plan_dtype_bytes(s);
    llama_closed_form_lora_activations(&s->cfg, &s->lora.cfg, s->batch, s->seq_len, &d, s->framework,
                                       s->attention != AG_ATTENTION_EAGER, s->checkpointing, af);
    // torch.autocast's casts (16-bit copies beside float32 tensors) are not in the closed form
    if (s->dt.autocast || s->dt.weight_bits != s->dt.act_bits) af->closed = false;
}

// The report's question answered in one line, before the detail: one device's total and, with a
// device, whether it fits and, if not, the first setting that would.
static void text_answer(FILE *out, const plan_view *v) {
    char x[64], d[64];
    const plan_setting *s = v->s;
    if (v->b->dev_oom) // what the device holds when the allocation fails is not the run's need
        fprintf(out, s->gpus > 1 ? "answer: out of memory on each of %ld devices" : "answer: out of memory", s->gpus);
    else if (s->gpus > 1)
        fprintf(out, "answer: %s on each of %ld devices", cli_short_bytes(x, sizeof x, v->g->total), s->gpus);
    else
        fprintf(out, "answer: %s on one device", cli_short_bytes(x, sizeof x, v->g->total));
    if (!v->device) {
        fprintf(out, " at the peak, %s of overhead included (--device-memory or --gpu: whether it fits)\n",
                cli_short_bytes(d, sizeof d, s->overhead));
        return;
    }
    bool fits = fits_device(v);
    if (s->dev.cuda && s->dev.gpu)
        fprintf(out, ": %s the %s", fits ? "fits" : "does NOT fit", s->dev.gpu->name);
    else
        fprintf(out, ": %s a %.4g GiB device", fits ? "fits" : "does NOT fit", (double)v->device / 1073741824.0);
    if (!fits && !s->infer && v->nsuggestions) {
        const plan_suggestion *g = &v->suggestions[0];
        fprintf(out, "; what would:");
        for (int k = 0; k < g->n; k++) fprintf(out, " %s", g->options[k]);
        fprintf(out, " (%s)", cli_short_bytes(x, sizeof x, g->total));
    }
    fprintf(out, "\n");
}
// With adapters: the frozen base and the adapters apart; gradients and state for the adapters.
static void text_states_lora(FILE *out, const plan_view *v) {
    const plan_setting *s = v->s;
    const plan_bill *b = v->b;
    llama_lora_closed_form lf;
    plan_lora_closed_form(s, &lf);
    uint64_t aw, ag, ak;
    lora_element_bytes(&lf, &aw, &ag, &ak);
    char f[256], x[64], y[64], t[256];
    unsigned long long A = (unsigned long long)lf.adapter_params;
    snprintf(f, sizeof f, "frozen base %s (%s) + adapters %llu x %llu", mp_format_bytes(x, sizeof x, lf.base_weights),
             s->lora.base_dtype ? s->lora.base_dtype : s->dt.long_name, A, (unsigned long long)aw);
    row(out, "weight", b->peak[MP_WEIGHT], lf.weights, f);
    snprintf(f, sizeof f, "adapters A x %llu = %llu x %llu; none for the frozen base", (unsigned long long)ag, A,
             (unsigned long long)ag);
    row(out, "gradient", b->peak[MP_GRADIENT], lf.gradients, f);
    snprintf(f, sizeof f, "adapters A x %llu; none for the frozen base", (unsigned long long)ak);
    row(out, "optimizer", b->peak[MP_OPTIMIZER], lf.optimizer, f);
    llama_lora_act_form af;
    plan_lora_act_form(s, &af);
    if (af.checkpointing)
        snprintf(f, sizeof f,
                 "the head's moment: %lld block inputs (%s) + head (%s); the recomputed block's is not closed",
                 (long long)s->cfg.layers, mp_format_bytes(x, sizeof x, af.act_block_inputs),
                 mp_format_bytes(y, sizeof y, af.act_head));
    else if (!af.closed)
        snprintf(f, sizeof f, "%s",
                 s->cfg.ff_norms          ? "Gemma's norms and soft-caps under LoRA are not in the closed form"
                 : s->cfg.moe.experts > 0 ? "a sparse block's router and experts under LoRA are not in the closed form"
                 : s->cfg.fused_proj      ? "phi3's fused projections under LoRA are not in the closed form"
                                          : "autocast's 16-bit casts are not in the closed form");
    else
        snprintf(f, sizeof f, "block 0 %s + %lld blocks x %s + head %s (frozen base: no input kept for its weights)%s",
                 mp_format_bytes(x, sizeof x, af.act_first_block), (long long)s->cfg.layers - 1,
                 mp_format_bytes(y, sizeof y, af.act_block), mp_format_bytes(t, sizeof t, af.act_head),
                 af.activations == af.act_forward_end          ? "; the peak is the forward's end (cache, logits)"
                 : af.activations == af.act_forward_softmax    ? "; the peak is the last block's softmax in forward"
                 : af.activations == af.act_backward_attention ? "; the peak is the last block's attention backward"
                                                               : "");
    row(out, "activation", b->peak[MP_ACTIVATION], af.closed ? af.activations : 0, f);
    row(out, "temporary", b->peak[MP_TEMPORARY], 0, TEMPORARY_TEXT);
    fprintf(out, "  %-11s %-36s step 2, the steady state; step 1 peak %s\n", "total peak",
            mp_format_bytes(x, sizeof x, b->total), mp_format_bytes(y, sizeof y, b->first_step));
    fprintf(out, "\n  %s\n", cli_lora_text(&s->cfg, &s->lora, t, sizeof t));
    cli_lora_params_text(out, &s->cfg, &s->lora);
    uint64_t four = lf.adapter_weights + lf.gradients + lf.optimizer;
    fprintf(out, "  four copies of what trains: %s = %.3f x the adapters; the frozen base adds %s\n",
            mp_format_bytes(x, sizeof x, four), lf.adapter_weights ? (double)four / (double)lf.adapter_weights : 0.0,
            mp_format_bytes(y, sizeof y, lf.base_weights));
}

static void report_train_text(FILE *out, const plan_view *v) {
    const plan_setting *s = v->s;
    char pc[32];
    char impl[32] = "";
    if (s->ocfg.kind == OPTIM_ADAM || s->ocfg.kind == OPTIM_ADAMW)
        snprintf(impl, sizeof impl, " (%s)", optim_adam_impl_name(s->ocfg.adam_impl));
    fprintf(out, "membill plan: %s, %s parameters, batch %ld x %ld tokens, %s%s, %s\n", s->cfg.name,
            cli_commas(pc, sizeof pc, v->cf->params), s->batch, s->seq_len, optim_kind_name(s->ocfg.kind), impl,
            s->dt.long_name);
    fprintf(out,
            "measured: the training step's own code run on shapes alone (meta mode); closed form: from the shapes\n");
    char fw[192];
    fprintf(out, "framework: %s; attention: %s\n", cli_framework_text(s->framework, s->cfg.family, fw, sizeof fw),
            cli_attention_text(s->attention));
    cli_routing_text(out, &s->cfg, &s->routing, true);
    if (s->ep > 1) {
        char x[64];
        fprintf(out,
                "expert parallel: %lld experts a sparse layer split over %ld ranks (%lld each), the rest data-parallel "
                "over %ld; all-to-all: %s sent by a rank a step\n",
                (long long)s->cfg.moe.experts, s->ep, (long long)(s->cfg.moe.experts / s->ep), s->gpus,
                mp_format_bytes(x, sizeof x, plan_all_to_all_bytes(s)));
        static const char *const sharded[] = {"", "optimizer state", "optimizer state and gradients",
                                              "weights, gradients and optimizer state"};
        if (s->zero > 0)
            fprintf(out,
                    "  %s: the dense parameters' %s sharded over all %ld ranks, each rank's experts' over the %ld "
                    "that hold the same experts (DeepSpeed's expert-data-parallel group)\n",
                    plan_strategy_name(s), sharded[s->zero], s->gpus, s->gpus / s->ep);
    }
    if (v->hub) cli_hub_text(out, v->hub);
    if (v->gpus_auto) {
        char d[96];
        plan_device_text(d, sizeof d, v->device);
        const long step = plan_gpus_step(s), less = v->min_gpus - step;
        char of[48] = "";
        if (step > 1) snprintf(of, sizeof of, " (a multiple of --ep %ld)", step);
        if (v->min_gpus)
            fprintf(out,
                    "--gpus auto: %ld GPU%s of %s (%s, batch %ld each), the fewest%s whose rank fits; %ld do%s "
                    "not\n",
                    v->min_gpus, v->min_gpus > 1 ? "s" : "", d, plan_strategy_name(s), s->batch, of, less,
                    less == 1 ? "es" : "");
        else
            fprintf(out,
                    "--gpus auto: no number of GPUs up to %d of %s fits this setting (%s); the bill below is %d's\n",
                    PLAN_MAX_GPUS, d, plan_strategy_name(s), PLAN_MAX_GPUS);
    }
    if (s->grad_accum > 1)
        fprintf(out, "gradient accumulation: %ld micro-batches of %ld rows a step (%ld rows a device)\n", s->grad_accum,
                s->batch, s->grad_accum * s->batch);
    if (s->checkpointing) fprintf(out, "checkpointing: each block's input kept, activations recomputed in backward\n");
    text_answer(out, v);
    fprintf(out, "\n  %-11s %-36s %-36s %s\n", "category", "meta bill (peak)", "closed form", "formula");
    if (s->lora.cfg.rank)
        text_states_lora(out, v);
    else
        text_states(out, v);
    if (s->gpus > 1 || s->zero > 0 || s->fsdp || v->device) text_per_gpu(out, v);
    if (s->dev.cuda) cli_device_text(out, &s->dev, v->devr ? v->devr : &v->b->dev);
    if (v->device) text_fit(out, v);
}

const char *plan_weight_dtype_name(const cli_dtype *d) { return d->weight_name ? d->weight_name : d->long_name; }

static void report_infer_text(FILE *out, const plan_view *v) {
    const plan_setting *s = v->s;
    const plan_bill *b = v->b;
    const gpu_share *g = v->g;
    char f[200], x[64];
    unsigned long long P = (unsigned long long)v->cf->params;
    fprintf(
        out,
        "membill plan --infer: %s, %llu parameters, batch %ld x %ld-token prompt, %ld new token%s, %s, weights %s\n",
        s->cfg.name, P, s->batch, s->seq_len, s->new_tokens, s->new_tokens > 1 ? "s" : "", s->dt.long_name,
        plan_weight_dtype_name(&s->dt));
    fprintf(out, "measured: the generation's own code (prefill, decode, KV cache) run on shapes alone (meta mode)\n");
    cli_mla_cache_text(out, &s->cfg);
    cli_mtp_text(out, &s->cfg);
    if (v->hub) cli_hub_text(out, v->hub);
    text_answer(out, v);
    fputc('\n', out);
    fprintf(out, "  %-11s %-36s %-36s %s\n", "category", "meta bill (peak)", "closed form", "formula");
    if (s->dt.weight_bits < 16)
        snprintf(f, sizeof f, "matrices %d bits an element%s%lld%s, norms at %d bits", s->dt.weight_bits,
                 s->dt.group ? " + one fp16 scale per " : "", (long long)s->dt.group,
                 s->dt.group ? " elements of a row" : "", s->dt.act_bits);
    else
        snprintf(f, sizeof f, "P x %d", s->dt.weight_bits / 8);
    if (s->dt.weight_bits < 16 && !s->dt.group)
        snprintf(f, sizeof f, "P x 1 (no scales billed), norms at %d bits", s->dt.act_bits);
    row(out, "weight", b->peak[MP_WEIGHT], infer_weight_bytes(s), f);
    char kf[160];
    snprintf(f, sizeof f, "%s x %d bytes x %ld tokens x batch %ld", llama_kv_cache_formula(&s->cfg, kf, sizeof kf),
             s->dt.act_bits / 8, plan_cache_tokens(s), s->batch);
    row(out, "cache", b->peak[MP_CACHE], v->cf->kv_cache, f);
    row(out, "activation", b->peak[MP_ACTIVATION], 0, "the prefill's peak (the logits of every prompt position)");
    row(out, "temporary", b->peak[MP_TEMPORARY], 0, TEMPORARY_TEXT);
    fprintf(out, "  %-11s %-36s\n", "total peak", mp_format_bytes(x, sizeof x, b->total));
    fprintf(out,
            "\n  the lesson: weights = parameters x bytes a parameter (fp32 4, bf16 2, int8 1, int4 about 0.5 plus\n"
            "  scales): %s here, %.4f bytes a parameter; inference = weights + KV cache + 1 to 2 GB of overhead\n",
            mp_format_bytes(x, sizeof x, b->peak[MP_WEIGHT]), P ? (double)b->peak[MP_WEIGHT] / (double)P : 0.0);
    fprintf(out, "\n  one device: weights %s", mp_format_bytes(x, sizeof x, g->weights));
    fprintf(out, " + cache %s", mp_format_bytes(x, sizeof x, g->cache));
    fprintf(out, " + activations %s", mp_format_bytes(x, sizeof x, g->activations));
    if (g->temporary) fprintf(out, " + temporary %s", mp_format_bytes(x, sizeof x, g->temporary));
    fprintf(out, " + overhead %s", mp_format_bytes(x, sizeof x, g->overhead));
    fprintf(out, " = %s\n", mp_format_bytes(x, sizeof x, g->total));
    if (s->dev.cuda) cli_device_text(out, &s->dev, v->devr ? v->devr : &v->b->dev);
    if (v->device) text_fit(out, v);
}

void plan_report_text(FILE *out, const void *arg) {
    const plan_view *v = arg;
    if (v->s->infer)
        report_infer_text(out, v);
    else
        report_train_text(out, v);
}

static json_t *closed_form_json(const llama_closed_form *cf, const plan_bill *b, bool checkpointing) {
    json_t *o = json_object();
    json_object_set_new(o, "parameters", json_integer((json_int_t)cf->params));
    json_object_set_new(o, "weight", json_integer((json_int_t)cf->weights));
    json_object_set_new(o, "gradient", json_integer((json_int_t)cf->gradients));
    json_object_set_new(o, "optimizer", json_integer((json_int_t)cf->optimizer));
    json_object_set_new(o, "activation", cf->closed ? json_integer((json_int_t)cf->activations) : json_null());
    if (cf->moe_blocks) {
        json_object_set_new(o, "sparse_blocks", json_integer(cf->moe_blocks));
        json_object_set_new(o, "activation_sparse_block_delta", json_integer((json_int_t)cf->act_moe_delta));
        json_object_set_new(o, "activation_experts_moment", json_integer((json_int_t)cf->act_experts_moment));
        json_object_set_new(o, "parameters_with_gradient", json_integer((json_int_t)cf->grad_params));
        json_object_set_new(o, "parameters_with_state", json_integer((json_int_t)cf->state_params));
    }
    json_object_set_new(o, "activation_per_block", json_integer((json_int_t)cf->act_per_block));
    json_object_set_new(o, "attention_probs_per_block", json_integer((json_int_t)cf->act_probs_per_block));
    json_object_set_new(o, "activation_head", json_integer((json_int_t)cf->act_head));
    json_object_set_new(o, "kv_cache", json_integer((json_int_t)cf->kv_cache));
    if (checkpointing) {
        json_object_set_new(o, "activation_block_inputs", json_integer((json_int_t)cf->act_block_inputs));
        json_object_set_new(o, "activation_head_moment", json_integer((json_int_t)cf->act_head_moment));
        json_object_set_new(o, "activation_recompute", json_integer((json_int_t)cf->act_recompute));
    }
    json_object_set_new(
        o, "activation_ratio_to_meta",
        json_real(b->peak[MP_ACTIVATION] ? (double)cf->activations / (double)b->peak[MP_ACTIVATION] : 0));
    return o;
}

// Training: each category's share at the device's steady-state peak (they add up to
// total_bytes with the overhead), and own_peak, each category's own peak at the device's share.
static json_t *formula_json(uint64_t bytes, const char *formula, const char *why) {
    json_t *o = json_object();
    json_object_set_new(o, "bytes", json_integer((json_int_t)bytes));
    json_object_set_new(o, "formula", json_string(formula));
    json_object_set_new(o, "differs_because", json_string(why));
    return o;
}

// The simulated rank: its collectives a step, ZeRO's and DeepSpeed's formulas beside it.
static void rank_json(json_t *pg, const plan_view *v) {
    const plan_setting *s = v->s;
    json_object_set_new(pg, "simulated_rank", json_boolean(v->b->simulated_rank));
    if (!v->b->simulated_rank) return;
    json_object_set_new(pg, "rank", json_integer(0));
    json_object_set_new(pg, "ranks", json_integer(s->gpus));
    json_object_set_new(pg, "bucket_bytes", json_integer((json_int_t)((uint64_t)s->bucket_mb << 20)));
    json_object_set_new(pg, "prefetch_layers", json_integer(s->prefetch));
    json_t *c = json_object();
    for (int k = 0; k < PAR_NCOLLECTIVES; k++) {
        json_t *e = json_object();
        json_object_set_new(e, "calls", json_integer((json_int_t)(v->b->comm.calls[k] / PLAN_STEPS_BILLED)));
        json_object_set_new(e, "bytes", json_integer((json_int_t)(v->b->comm.bytes[k] / PLAN_STEPS_BILLED)));
        json_object_set_new(e, "sent_bytes", json_integer((json_int_t)(v->b->comm.sent_bytes[k] / PLAN_STEPS_BILLED)));
        json_object_set_new(c, par_collective_name(k), e);
    }
    json_object_set_new(pg, "collectives_per_step", c);
    char f[256];
    llama_dtype_bytes d = plan_dtype_bytes(s);
    uint64_t paper = zero_formula(s, &d, v->cf->params, f, sizeof f);
    json_object_set_new(pg, "zero_paper", formula_json(paper, f, paper_why));
    uint64_t ds = deepspeed_formula(s, v->cf->params, f, sizeof f);
    json_object_set_new(pg, "deepspeed", ds ? formula_json(ds, f, deepspeed_why_of(s)) : json_null());
    json_object_set_new(pg, "strategy", json_string(plan_strategy_name(s)));
    json_object_set_new(pg, "fsdp", s->fsdp ? json_string(par_fsdp_name((par_fsdp)s->fsdp)) : json_null());
    json_object_set_new(pg, "offload",
                        s->offload ? json_string(par_offload_name((par_offload)s->offload)) : json_null());
    json_object_set_new(pg, "largest_layer_params", json_integer((json_int_t)largest_layer(&s->cfg)));
    // --ep: the ranks a rank's experts are data-parallel (and sharded) over
    json_object_set_new(pg, "expert_data_parallel_ranks", s->ep > 1 ? json_integer(s->gpus / s->ep) : json_null());
}

static json_t *per_gpu_json(const gpu_share *g, bool infer) {
    json_t *pg = json_object(), *own = json_object();
    json_object_set_new(pg, "weight", json_integer((json_int_t)g->weights));
    json_object_set_new(pg, "gradient", json_integer((json_int_t)g->gradients));
    json_object_set_new(pg, "optimizer", json_integer((json_int_t)g->optimizer));
    json_object_set_new(pg, "activation", json_integer((json_int_t)g->activations));
    json_object_set_new(pg, "cache", json_integer((json_int_t)g->cache));
    json_object_set_new(pg, "temporary", json_integer((json_int_t)g->temporary));
    json_object_set_new(pg, "overhead", json_integer((json_int_t)g->overhead));
    json_object_set_new(pg, "total_bytes", json_integer((json_int_t)g->total));
    if (!infer) {
        json_object_set_new(pg, "step", json_integer(2));
        json_object_set_new(pg, "phase", json_string(mp_phase_name(g->phase)));
    }
    json_t *host = json_object();
    for (int c = 0; c < MP_NCATEGORIES; c++) {
        json_object_set_new(own, mp_category_name(c), json_integer((json_int_t)g->own_peak[c]));
        json_object_set_new(host, mp_category_name(c), json_integer((json_int_t)g->host[c]));
    }
    json_object_set_new(pg, "own_peak", own);
    json_object_set_new(pg, "host", host);
    json_object_set_new(pg, "host_total_bytes", json_integer((json_int_t)g->host_total));
    return pg;
}

// Bytes a parameter of each model state, measured, and ZeRO's formula for the device.
static json_t *states_json(const plan_view *v) {
    const plan_bill *b = v->b;
    uint64_t P = v->cf->params, states = b->peak[MP_WEIGHT] + b->peak[MP_GRADIENT] + b->peak[MP_OPTIMIZER];
    json_t *o = json_object();
    json_object_set_new(o, "weight", json_real(P ? (double)b->peak[MP_WEIGHT] / (double)P : 0));
    json_object_set_new(o, "gradient", json_real(P ? (double)b->peak[MP_GRADIENT] / (double)P : 0));
    json_object_set_new(o, "optimizer", json_real(P ? (double)b->peak[MP_OPTIMIZER] / (double)P : 0));
    json_object_set_new(o, "total", json_real(P ? (double)states / (double)P : 0));
    json_object_set_new(o, "states_bytes", json_integer((json_int_t)states));
    json_object_set_new(o, "lesson_70b_claim_bytes", json_integer((json_int_t)1120000000000LL));
    char f[256];
    llama_dtype_bytes d = plan_dtype_bytes(v->s);
    json_object_set_new(o, "zero_formula_bytes", json_integer((json_int_t)zero_formula(v->s, &d, P, f, sizeof f)));
    json_object_set_new(o, "zero_formula", json_string(f));
    return o;
}

static json_t *infer_json(const plan_view *v) {
    const plan_setting *s = v->s;
    json_t *o = json_object();
    json_object_set_new(o, "weights_bytes", json_integer((json_int_t)v->b->peak[MP_WEIGHT]));
    json_object_set_new(o, "weights_closed_form", json_integer((json_int_t)infer_weight_bytes(s)));
    json_object_set_new(o, "weight_bits", json_integer(s->dt.weight_bits));
    json_object_set_new(o, "group_size", json_integer((json_int_t)s->dt.group));
    json_object_set_new(o, "scale_bytes", json_integer(s->dt.scale_bytes));
    json_object_set_new(o, "norm_bits", json_integer(s->dt.weight_bits < 16 ? s->dt.act_bits : s->dt.weight_bits));
    json_object_set_new(o, "cache_bytes", json_integer((json_int_t)v->b->peak[MP_CACHE]));
    json_object_set_new(o, "cache_closed_form", json_integer((json_int_t)v->cf->kv_cache));
    json_object_set_new(o, "cache_tokens", json_integer(plan_cache_tokens(s)));
    json_object_set_new(o, "activation_bytes", json_integer((json_int_t)v->b->peak[MP_ACTIVATION]));
    json_object_set_new(o, "temporary_bytes", json_integer((json_int_t)v->b->peak[MP_TEMPORARY]));
    return o;
}

static json_t *run_json(const plan_setting *s) {
    json_t *run = json_object();
    json_object_set_new(run, "kind", json_string("plan"));
    json_object_set_new(run, "infer", json_boolean(s->infer));
    json_object_set_new(run, "batch", json_integer(s->batch));
    json_object_set_new(run, "seq_len", json_integer(s->seq_len));
    if (s->infer)
        json_object_set_new(run, "new_tokens", json_integer(s->new_tokens));
    else
        json_object_set_new(run, "optimizer", json_string(optim_kind_name(s->ocfg.kind)));
    bool adam = !s->infer && (s->ocfg.kind == OPTIM_ADAM || s->ocfg.kind == OPTIM_ADAMW);
    json_object_set_new(run, "adam_impl", adam ? json_string(optim_adam_impl_name(s->ocfg.adam_impl)) : json_null());
    json_object_set_new(run, "dtype", json_string(s->dt.long_name));
    json_object_set_new(run, "weight_dtype", json_string(plan_weight_dtype_name(&s->dt)));
    json_object_set_new(run, "meta", json_true());
    json_object_set_new(run, "framework", json_string(cli_framework_name(s->framework)));
    cli_mtp_json(run, &s->cfg);
    if (s->infer) cli_mla_cache_json(run, &s->cfg);
    if (s->cfg.moe.experts > 0) json_object_set_new(run, "routing", json_string(cli_routing_name(&s->routing, true)));
    if (s->ep > 1) {
        json_object_set_new(run, "ep", json_integer(s->ep));
        json_object_set_new(run, "all_to_all_bytes_per_step", json_integer((json_int_t)plan_all_to_all_bytes(s)));
    }
    json_object_set_new(run, "attention", json_string(cli_attention_name(s->attention)));
    if (!s->infer) json_object_set_new(run, "checkpointing", json_boolean(s->checkpointing));
    json_object_set_new(run, "gpus", json_integer(s->gpus));
    json_object_set_new(run, "zero", json_integer(s->zero));
    json_object_set_new(run, "fsdp", s->fsdp ? json_string(par_fsdp_name((par_fsdp)s->fsdp)) : json_null());
    json_object_set_new(run, "offload",
                        s->offload ? json_string(par_offload_name((par_offload)s->offload)) : json_null());
    if (!s->infer) json_object_set_new(run, "grad_accum", json_integer(s->grad_accum));
    json_object_set_new(run, "overhead_bytes", json_integer((json_int_t)s->overhead));
    return run;
}

// Under --gpus, the simulated rank's device: the figures of "device" (the replay runs on that
// rank's allocations), beside the rank they are of.
static json_t *rank_device_json(const json_t *pg, const json_t *dev) {
    static const char *const keys[] = {"allocated_peak_bytes",
                                       "reserved_peak_bytes",
                                       "inactive_split_bytes_at_peak",
                                       "context_bytes",
                                       "nccl_bytes",
                                       "need_bytes",
                                       "total_bytes",
                                       "fits"};
    json_t *o = json_object();
    json_object_set(o, "rank", json_object_get(pg, "rank"));
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        json_t *x = json_object_get(dev, keys[i]);
        json_object_set(o, keys[i], x ? x : json_null());
    }
    return o;
}

json_t *plan_report_json(const plan_view *v) {
    const plan_setting *s = v->s;
    json_t *root = cli_report_root(&s->cfg);
    json_object_set_new(root, "run", run_json(s));
    if (v->hub) json_object_set_new(root, "hub", cli_hub_json(v->hub));
    // The profiler's report, with the headline beside its "peak" (the whole run's): training,
    // step 2's total peak (the steady state) and step 1's; a generation, its total peak.
    json_t *rep = json_object();
    mp_report_json(rep);
    const char *key;
    json_t *val;
    json_object_foreach(rep, key, val) {
        json_object_set(root, key, val);
        if (strcmp(key, "peak") != 0) continue;
        json_object_set_new(root, "total_peak_bytes", json_integer((json_int_t)v->b->total));
        if (!s->infer) json_object_set_new(root, "first_step_peak_bytes", json_integer((json_int_t)v->b->first_step));
        if (v->other) {
            json_t *oa = json_object();
            json_object_set_new(oa, "attention", json_string(cli_attention_name(plan_other_attention(s->attention))));
            json_object_set_new(oa, "total_peak_bytes", json_integer((json_int_t)v->other->total));
            json_object_set_new(oa, "activation_bytes", json_integer((json_int_t)v->other->peak[MP_ACTIVATION]));
            json_object_set_new(root, "other_attention", oa);
        }
    }
    json_decref(rep);
    json_object_set_new(root, "closed_form", closed_form_json(v->cf, v->b, s->checkpointing));
    if (s->lora.cfg.rank && !s->infer) {
        const uint64_t b_act = v->b->peak[MP_ACTIVATION];
        llama_lora_closed_form lf;
        plan_lora_closed_form(s, &lf);
        json_t *cf = json_object_get(root, "closed_form"), *l = cli_lora_json(&s->cfg, &s->lora);
        // with adapters the model states and the activations are LoRA's
        llama_lora_act_form af;
        plan_lora_act_form(s, &af);
        json_object_set_new(cf, "weight", json_integer((json_int_t)lf.weights));
        json_object_set_new(cf, "gradient", json_integer((json_int_t)lf.gradients));
        json_object_set_new(cf, "optimizer", json_integer((json_int_t)lf.optimizer));
        json_object_set_new(cf, "activation", af.closed ? json_integer((json_int_t)af.activations) : json_null());
        json_object_set_new(cf, "activation_first_block", json_integer((json_int_t)af.act_first_block));
        json_object_set_new(cf, "activation_per_block", json_integer((json_int_t)af.act_block));
        json_object_set_new(cf, "activation_head", json_integer((json_int_t)af.act_head));
        json_object_set_new(cf, "activation_forward_end", json_integer((json_int_t)af.act_forward_end));
        json_object_set_new(cf, "activation_forward_softmax", json_integer((json_int_t)af.act_forward_softmax));
        json_object_set_new(cf, "activation_backward_attention", json_integer((json_int_t)af.act_backward_attention));
        json_object_del(cf, "attention_probs_per_block");
        if (s->checkpointing) {
            json_object_set_new(cf, "activation_block_inputs", json_integer((json_int_t)af.act_block_inputs));
            json_object_set_new(cf, "activation_head_moment", json_integer((json_int_t)af.act_head));
            json_object_set_new(cf, "activation_recompute", json_integer((json_int_t)af.act_recompute));
        }
        json_object_set_new(cf, "activation_ratio_to_meta",
                            json_real(af.closed && b_act ? (double)af.activations / (double)b_act : 0));
        json_object_set_new(l, "base_weight_bytes", json_integer((json_int_t)lf.base_weights));
        json_object_set_new(l, "closed_form_adapter_weight_bytes", json_integer((json_int_t)lf.adapter_weights));
        json_object_set_new(root, "lora", l);
    }
    if (s->infer)
        json_object_set_new(root, "inference", infer_json(v));
    else
        json_object_set_new(root, "bytes_per_parameter", states_json(v));
    json_t *pg = per_gpu_json(v->g, s->infer);
    if (!s->infer) rank_json(pg, v);
    json_object_set_new(root, "per_gpu", pg);
    if (s->dev.cuda) {
        json_t *dev = cli_device_json(&s->dev, v->devr ? v->devr : &v->b->dev);
        json_object_set_new(root, "device", dev);
        if (json_is_true(json_object_get(pg, "simulated_rank")))
            json_object_set_new(pg, "device", rank_device_json(pg, dev));
    }
    if (v->device) {
        json_t *fit = json_object();
        json_object_set_new(fit, "device_memory_bytes", json_integer((json_int_t)v->device));
        json_object_set_new(fit, "overhead_bytes", json_integer((json_int_t)s->overhead));
        json_object_set_new(fit, "fits", json_boolean(fits_device(v)));
        json_object_set_new(fit, "largest_batch", json_integer(v->max_batch));
        json_object_set_new(fit, "longest_seq_len", json_integer(v->max_seq));
        json_object_set_new(fit, "largest_batch_is_search_cap", json_boolean(v->batch_capped));
        json_object_set_new(fit, "longest_seq_len_is_positions", json_boolean(v->seq_capped));
        if (!v->max_batch && !v->max_seq)
            json_object_set_new(fit, "smallest_bytes", json_integer((json_int_t)v->smallest));
        json_object_set_new(fit, "device_memory_gib", json_real((double)v->device / 1073741824.0));
        if (v->gpus_auto) json_object_set_new(fit, "min_gpus", v->min_gpus ? json_integer(v->min_gpus) : json_null());
        json_t *sug = json_array();
        for (int i = 0; i < v->nsuggestions; i++) {
            json_t *e = json_object(), *opts = json_array();
            for (int k = 0; k < v->suggestions[i].n; k++)
                json_array_append_new(opts, json_string(v->suggestions[i].options[k]));
            json_object_set_new(e, "options", opts);
            json_object_set_new(e, "total_bytes", json_integer((json_int_t)v->suggestions[i].total));
            json_array_append_new(sug, e);
        }
        json_object_set_new(fit, "suggestions", sug);
        json_object_set_new(root, "fit", fit);
    }
    return root;
}

// The options of membill plan into a setting; a usage error prints one line and returns false.

uint64_t plan_all_to_all_bytes(const plan_setting *s) {
    // each sparse layer sends its (token, choice) rows out and their outputs back, in forward and
    // again (their gradients) in backward; the rows of the rank's own experts stay
    int64_t sparse = 0;
    for (int64_t i = 0; i < s->cfg.layers; i++) sparse += llama_layer_moe(&s->cfg, i);
    const uint64_t rows = (uint64_t)s->batch * (uint64_t)s->seq_len * (uint64_t)s->cfg.moe.top_k,
                   row = (uint64_t)s->cfg.hidden * (uint64_t)s->dt.act_bits / 8;
    return (uint64_t)sparse * 4 * rows * row / (uint64_t)s->ep * (uint64_t)(s->ep - 1);
}
