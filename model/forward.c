// The training forward of LlamaForCausalLM, one op at a time. Each intermediate is released
// as soon as the next op has it, so what stays alive is exactly what the tape saved. With
// checkpointing, a block's tape is rebuilt in backward and only its input stays meanwhile (with
// what the framework's row says its layers keep of their other arguments).
#include "blocks.h"
#include "model_internal.h"

#include <float.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

// What a checkpointed block needs again in backward (copied by ag_checkpoint).
typedef struct {
    const llama_config *c;
    const llama_layer *L;
    int64_t i;
    const llama_forward_opts *o; // its part hook, NULL: none
    ag_tensor *cos, *sin;        // the rotary tables, kept by the checkpoint's node; NULL: none
    int64_t forward;             // the forward it belongs to: a recomputation routes as that forward did
} block_arg;

// The recomputation in backward runs with grad mode on (the forward's run has it off): the part
// hook gathers the block's parameters again before it (ZeRO-3 frees them after the forward).
static ag_tensor *block_fn(ag_ctx *ctx, const void *arg, ag_tensor *x) {
    const block_arg *a = arg;
    ag_err e = {""};
    if (a->o && a->o->on_part && ag_is_grad_enabled(ctx) && !a->o->on_part(a->o->user, a->i + 1, true, &e)) {
        ag_release(x);
        ag_ctx_fail(ctx, e.msg);
        return NULL;
    }
    llama_shared sh = {.cos = a->cos, .sin = a->sin};
    int64_t now = a->L->moe->forward;
    a->L->moe->forward = a->forward;
    ag_tensor *y = llama_block(ctx, a->c, a->L, a->cos ? &sh : NULL, x, a->i);
    a->L->moe->forward = now;
    return y;
}

// Block i on x, taking ownership of x; checkpointed, x stays for backward, and of the layer's other
// arguments (its mask, the positions, the rotary tables) what the framework keeps.
static ag_tensor *run_block(ag_ctx *ctx, const llama_model *m, const llama_shared *sh, ag_tensor *const mask[2],
                            const llama_forward_opts *o, ag_tensor *x, int64_t i) {
    if (!o || !o->checkpointing) return llama_block(ctx, &m->cfg, &m->layers[i], sh, x, i);
    char s[96];
    snprintf(s, sizeof s, "layers.%lld", (long long)i);
    // the layer's own rotary tables: Gemma 3's sliding layers take rotary_emb_local's
    const bool local = sh->cos_local && llama_layer_window(&m->cfg, i) > 0;
    ag_tensor *cs = local ? sh->cos_local : sh->cos, *sn = local ? sh->sin_local : sh->sin;
    block_arg a = {&m->cfg, &m->layers[i], i, o, cs, sn, m->moe.forward};
    ag_tensor *layer_mask = mask[1] && llama_layer_window(&m->cfg, i) > 0 ? mask[1] : mask[0];
    ag_checkpoint_args args = {{layer_mask, sh->positions}, {cs, sn}};
    ag_tensor *y = ag_checkpoint_with(ctx, s, block_fn, &a, sizeof a, x, &args);
    ag_release(x);
    return y;
}

// Whether a layer of the config has a sliding window shorter than T tokens.
static bool window_within(const llama_config *c, int64_t T) {
    return c->sliding_window > 0 && c->window_from < c->layers && c->sliding_window < T;
}

// mask[rows, cols] as transformers fills it: 0 where query r % T may look, the lowest float
// elsewhere (later keys; keys the window, if any, leaves behind).
// (The lowest finite value of the mask's dtype: torch.finfo(dtype).min.)
static void fill_mask(ag_tensor *mask, int64_t T, int64_t window) {
    const int64_t rows = mask->shape[0], cols = mask->shape[1];
    const float lowest = mask->dtype == AG_BF16 ? -3.38953139e38f : mask->dtype == AG_F16 ? -65504.0f : -FLT_MAX;
    float *v = mask->dtype == AG_F32 ? mask->data : malloc((size_t)(rows * cols) * sizeof(float));
    if (!v) return; // the mask is billed, not read: ag_attention applies the pattern itself
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < cols; j++)
            v[r * cols + j] = j > r % T || (window > 0 && r % T - j >= window) ? lowest : 0.0f;
    if (v != mask->data) ag_tensor_from_f32(mask, v), free(v);
}

// What transformers' LlamaModel.forward makes before its first layer: the rotary tables, the 4-D
// causal mask (PyTorch 1.13's transformers: torch.full((T, T + 1), min) then triu, target length
// T + 1 without an attention mask; current transformers: [B, 1, T, T] from a boolean mask), and
// the DynamicCache (use_cache defaults to true; checkpointing turns it off, and makes the positions
// cache_position, int64 [T], that every checkpointed layer receives). The mask is billed and filled as transformers
// fills it; ag_attention applies the same pattern itself. Current transformers makes one mask per
// kind of layer: Mistral's sliding one alone, Qwen2's and Qwen3's full one and, when some layers
// slide, the sliding one too (mask[1]).
static bool hf_prepare(ag_ctx *ctx, const llama_model *m, int64_t B, int64_t T, bool checkpointing, llama_shared *sh,
                       ag_tensor *mask[2]) {
    const llama_config *c = &m->cfg;
    const ag_rope_freqs f = llama_rope_freqs_at(c, T);
    const ag_framework_row *fw = ag_ctx_framework_row(ctx);
    if (checkpointing && AG_FW(fw, checkpoint_args) != AG_CKPT_ARGS_NONE &&
        !(sh->positions = ag_tensor_new_bits(ctx, 1, &T, MP_ACTIVATION, "cache_position", 64)))
        return false;
    if (AG_FW(fw, rope_tables) && !ag_rope_tables_f(ctx, "rotary_emb", T, (int)c->head_dim, &f, 0, &sh->cos, &sh->sin))
        return false;
    const ag_rope_freqs local = {(float)c->rope_local_theta, NULL, 1.0f};
    if (AG_FW(fw, rope_tables) && c->rope_local_theta > 0.0 &&
        !ag_rope_tables_f(ctx, "rotary_emb_local", T, (int)c->head_dim, &local, 0, &sh->cos_local, &sh->sin_local))
        return false;
    const ag_mask_shape shape = AG_FW(fw, mask);
    bool old = shape == AG_MASK_T_T1;
    int64_t cols = old ? T + 1 : T, rows = old ? T : B * T;
    bool qwen = c->family == LLAMA_FAMILY_QWEN2 || c->family == LLAMA_FAMILY_QWEN3 || c->window_period > 0;
    bool sliding = c->sliding_window > 0 && c->window_from < c->layers, two = !old && qwen && sliding;
    // SDPA: without padding, transformers' sdpa_mask returns None and is_causal does the masking
    // (which also lets SDPA take GQA as it is, enable_gqa, without repeat_kv), unless a sliding
    // window shorter than the sequence needs a mask (transformers' is boolean, 1 byte an element;
    // it is billed here at the mask's own element size).
    bool sdpa = ag_ctx_attention(ctx) != AG_ATTENTION_EAGER, sdpa_window = sdpa && window_within(c, T);
    for (int k = 0; shape != AG_MASK_NONE && k < (two ? 2 : 1); k++) {
        bool full = two && k == 0, needed = !sdpa || (!full && sdpa_window);
        mask[k] = needed ? ag_tensor_new(ctx, 2, (int64_t[]){rows, cols}, MP_ACTIVATION, "causal_mask") : NULL;
        if (needed && !mask[k]) return false;
        if (mask[k] && !mp_is_meta()) fill_mask(mask[k], T, full || !sliding ? 0 : c->sliding_window);
    }
    if (checkpointing || c->no_cache || !AG_FW(fw, output_cache)) return true; // use_cache false: no DynamicCache
    sh->cache = calloc((size_t)(2 * c->layers), sizeof *sh->cache);
    return sh->cache != NULL;
}

// The caller's hook around one part of the forward; false (its message in err) stops the forward.
typedef struct {
    const llama_forward_opts *o; // NULL: no hook
    ag_err *err;
    bool ok;
} part_hook;

static bool part(part_hook *h, int64_t i, bool before) {
    if (!h->o || !h->o->on_part || !h->ok) return h->ok;
    h->ok = h->o->on_part(h->o->user, i, before, h->err);
    return h->ok;
}

// loss + router_aux_loss_coef x the load-balancing loss of the routers' logits the sparse layers
// kept (MixtralForCausalLM.forward with output_router_logits); the logits go with it.
static ag_tensor *with_aux_loss(ag_ctx *ctx, llama_model *m, ag_tensor *loss) {
    const llama_config *c = &m->cfg;
    ag_tensor **kept = m->moe.logits, *list[c->layers];
    int n = 0;
    for (int64_t i = 0; i < c->layers; i++)
        if (kept[i]) list[n++] = kept[i];
    ag_tensor *total = loss;
    if (loss && n > 0) {
        ag_tensor *aux = ag_moe_aux_loss(ctx, "aux_loss", n, list, (int)c->moe.top_k);
        ag_tensor *scaled = ag_scale(ctx, "aux_loss_scaled", aux, (float)c->moe.aux_coef);
        total = ag_add(ctx, "loss_with_aux", loss, scaled);
        ag_release(aux), ag_release(scaled), ag_release(loss);
    }
    for (int64_t i = 0; i < c->layers; i++) ag_release(kept[i]), kept[i] = NULL;
    return total;
}

// The embeddings of ids; Gemma 2 scales them by sqrt(hidden_size) (a new tensor; the lookup's goes).
static ag_tensor *embed(ag_ctx *ctx, const llama_model *m, const int32_t *ids, int64_t B, int64_t T) {
    const llama_config *c = &m->cfg;
    ag_tensor *x = ag_embedding_padded(ctx, "embed_tokens", ids, B, T, m->embed, c->pad_token ? c->pad_token_id : -1);
    if (!x || !c->embed_scale) return x;
    ag_tensor *y = ag_scale(ctx, "embed_scale", x, llama_embedding_scale(c));
    ag_release(x);
    return y;
}

// logits = lm_head(x); Gemma 2 caps them (final_logit_softcapping), the raw ones freed.
static ag_tensor *head(ag_ctx *ctx, const llama_model *m, ag_tensor *x) {
    ag_tensor *logits = ag_linear(ctx, "lm_head:logits", x, m->lm_head, NULL);
    if (!logits || m->cfg.final_softcap <= 0.0) return logits;
    ag_tensor *capped = ag_softcap(ctx, "final_softcap:logits", logits, (float)m->cfg.final_softcap);
    ag_release(logits);
    return capped;
}

ag_tensor *llama_forward_loss(ag_ctx *ctx, llama_model *m, const int32_t *ids, int64_t B, int64_t T, ag_err *err) {
    return llama_forward_loss_opts(ctx, m, NULL, ids, B, T, err);
}

ag_tensor *llama_forward_loss_opts(ag_ctx *ctx, llama_model *m, const llama_forward_opts *opts, const int32_t *ids,
                                   int64_t B, int64_t T, ag_err *err) {
    const llama_config *c = &m->cfg;
    const bool checkpointing = opts && opts->checkpointing;
    if (checkpointing && m->moe.logits) {
        ag_err_set(err, "output_router_logits with checkpointing: the routers' logits of a recomputed block are not "
                        "kept for the load-balancing loss (membill does not model it)");
        return NULL;
    }
    if (llama_family_check_run(c, ctx, "forward", err) != 0) return NULL;
    if (B < 1 || T < 2 || T > c->max_positions) {
        ag_err_set(err,
                   "batch %lld x length %lld: a training step needs batch >= 1 and a length of 2 to %lld tokens "
                   "(max_position_embeddings)",
                   (long long)B, (long long)T, (long long)c->max_positions);
        return NULL;
    }
    if (!mp_is_meta() && B > INT32_MAX / T) { // meta mode holds no ids, so only a real run has this limit
        ag_err_set(err, "batch %lld x length %lld: a real step holds at most 2^31 token ids (--meta bills it)",
                   (long long)B, (long long)T);
        return NULL;
    }
    if (!mp_is_meta() && llama_check_tokens(c, ids, (size_t)(B * T), err) != 0) return NULL;
    m->lora.training = true; // the adapters' dropout draws this forward's masks
    m->lora.forwards++;
    part_hook hk = {opts, err, true};
    ag_tensor *x = part(&hk, 0, true) ? embed(ctx, m, ids, B, T) : NULL;
    if (x && !part(&hk, 0, false)) ag_release(x), x = NULL;
    llama_shared sh = {0};
    ag_tensor *mask[2] = {NULL, NULL};
    if (x && !hf_prepare(ctx, m, B, T, checkpointing, &sh, mask)) ag_release(x), x = NULL;
    for (int64_t i = 0; i < c->layers && x; i++) {
        if (!part(&hk, i + 1, true)) ag_release(x), x = NULL;
        if (x) x = run_block(ctx, m, &sh, mask, opts, x, i);
        if (x && !part(&hk, i + 1, false)) ag_release(x), x = NULL;
    }
    if (x && !part(&hk, c->layers + 1, true)) ag_release(x), x = NULL;
    ag_tensor *n = llama_norm(ctx, c, "norm", x, m->norm);
    ag_release(x);
    // LlamaModel.forward returns: its mask and its references to the tables go.
    ag_release(mask[0]);
    ag_release(mask[1]);
    ag_release(sh.cos);
    ag_release(sh.sin);
    ag_release(sh.positions);
    ag_release(sh.cos_local);
    ag_release(sh.sin_local);
    ag_tensor *logits = head(ctx, m, n);
    // transformers: the base model's output object holds the last hidden state until the
    // causal LM's forward returns (it matters where lm_head keeps a cast of it, not it).
    if (!AG_FW(ag_ctx_framework_row(ctx), output_holds_hidden)) ag_release(n), n = NULL;
    ag_tensor *loss = ag_cross_entropy(ctx, "loss", logits, ids);
    ag_release(n);
    if (loss && !mp_is_meta() && llama_check_logits(ctx, m, logits, loss, err) != 0) {
        hk.ok = false; // the message is set
        ag_release(loss), loss = NULL;
    }
    if (m->moe.logits) loss = with_aux_loss(ctx, m, loss);
    // The output (logits and the DynamicCache) is dropped once the loss is out of it, as the
    // Trainer's compute_loss does.
    ag_release(logits);
    for (int64_t i = 0; sh.cache && i < 2 * c->layers; i++) ag_release(sh.cache[i]);
    free(sh.cache);
    m->moe.forward++;
    if (loss && !part(&hk, c->layers + 1, false)) ag_release(loss), loss = NULL;
    if (!loss && hk.ok) ag_err_set(err, "forward: %s", ag_ctx_error(ctx) ? ag_ctx_error(ctx) : "failed");
    return loss;
}

ag_tensor *llama_forward_logits(ag_ctx *ctx, llama_model *m, const int32_t *ids, int64_t B, int64_t T, ag_err *err) {
    const llama_config *c = &m->cfg;
    if (llama_family_check_run(c, ctx, "forward", err) != 0) return NULL;
    if (B < 1 || T < 1 || T > c->max_positions || B > INT32_MAX / T) {
        ag_err_set(err, "batch %lld x length %lld: expected batch >= 1 and 1 to %lld tokens", (long long)B,
                   (long long)T, (long long)c->max_positions);
        return NULL;
    }
    if (!mp_is_meta() && llama_check_tokens(c, ids, (size_t)(B * T), err) != 0) return NULL;
    m->lora.training = false;
    ag_tensor *x = embed(ctx, m, ids, B, T);
    for (int64_t i = 0; i < c->layers && x; i++) x = llama_block(ctx, c, &m->layers[i], NULL, x, i);
    for (int64_t i = 0; m->moe.logits && i < c->layers; i++) ag_release(m->moe.logits[i]), m->moe.logits[i] = NULL;
    m->moe.forward++;
    ag_tensor *n = llama_norm(ctx, c, "norm", x, m->norm);
    ag_release(x);
    ag_tensor *logits = head(ctx, m, n);
    ag_release(n);
    if (!logits) ag_err_set(err, "forward: %s", ag_ctx_error(ctx) ? ag_ctx_error(ctx) : "failed");
    return logits;
}
