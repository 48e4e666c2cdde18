// LoRA's (and QLoRA's) activation peak in closed form: what each op of a block saves for
// backward once the base is frozen, which depends on which of its operands needs a gradient.
//
// A block is followed op by op on shapes alone: each tensor carries its bytes, whether it needs
// a gradient, and whether some node keeps it (a tensor kept by two nodes counts once). The
// rules are the ops' own (autograd/ops/*.c):
// - linear: x only for dW (never, the base and lm_head frozen; an adapter's A keeps its input,
//   B keeps A's output [B, T, r]); nothing at all when neither x nor W needs a gradient.
// - RMSNorm (recorded when x needs a gradient): lean keeps x and a float32 rstd a row; the
//   PyTorch frameworks keep x (its float32 copy in a 16-bit model) and rstd, PyTorch 1.13 also
//   x² in float32; a frozen norm keeps no x * rstd.
// - dropout (p > 0, on each adapter's input): a new [B, T, in] tensor, which A keeps; under the
//   PyTorch frameworks a one-byte mask per element when the input needs a gradient.
// - RoPE: lean keeps nothing; the PyTorch frameworks keep the rotary tables cos and sin
//   [1, T, head_dim], once for the whole forward, when some rotated input needs a gradient.
// - attention, lean eager: q when k needs a gradient, k when q does, v when either does, and the
//   probabilities; lean flash and SDPA: q, k, v, the output (SDPA's own [B, heads, T, D] beside
//   the transposed copy o_proj reads) and a float32 log-sum-exp a row; PyTorch's eager attention:
//   q (a contiguous copy when batch > 1), k and v repeated to every query head (or as they are:
//   ag_eager_kv_layout), the float32 probabilities (and their cast to a 16-bit q), and the 8-byte
//   scaling scalar.
// - silu keeps its input, the product each factor the other needs; add and scale nothing.
// The peak is the largest of these moments (each with every saved set live):
// - the head at the start of backward (the loss's gradient buffers): the usual one;
// - PyTorch frameworks: the forward's end, as the loss is made (the DynamicCache, the logits, their
//   float32 copy and log_softmax live): with a small vocabulary;
// - PyTorch's eager attention: the last block's softmax in forward (masked scores, their float32
//   copy and the probabilities live at once), or its attention backward (d(probs), d(v), d(scores)):
//   with long sequences.
// The embedding is frozen, so block 0's input needs no gradient: below its first adapter
// nothing is recorded, and what its ops keep differs from every later block's (whose input, the
// residual stream, always needs one).
#include "model.h"

#include <string.h>

typedef struct {
    uint64_t bytes;
    bool grad; // needs a gradient
    bool kept; // counted once in the saved set
} cf_t;

typedef struct {
    const llama_config *c;
    const llama_lora_config *l;
    uint64_t BT, B, T, a;       // a: bytes of an activation element
    const ag_framework_row *fw; // whose saved sets
    bool flash, checkpointing;
    uint64_t saved; // bytes kept so far
    bool tables;    // the rotary tables are kept (PyTorch frameworks)
    uint64_t cache; // what the DynamicCache holds beyond the saved set (PyTorch frameworks)
    uint64_t att;   // PyTorch's eager attention: what the block holds as softmax's output is made
    uint64_t pre_o; // the block's saved set up to its attention (what its backward reaches last)
} cf_walk;

static cf_t cf_new(uint64_t bytes, bool grad) { return (cf_t){bytes, grad, false}; }

static void cf_keep(cf_walk *w, cf_t *t) {
    if (t->kept) return;
    t->kept = true;
    w->saved += t->bytes;
}

// RMSNorm of x (rows of `width`, the frozen weight): the output, recorded when x needs a gradient.
static cf_t cf_norm(cf_walk *w, cf_t *x, uint64_t rows, uint64_t width) {
    if (x->grad) {
        const ag_rmsnorm_saves saves = AG_FW(w->fw, rmsnorm);
        if (saves != AG_RMSNORM_X_RSTD && w->a < 4)
            w->saved += rows * width * 4; // x.to(float32)
        else
            cf_keep(w, x);
        w->saved += rows * 4;                                             // rstd
        if (saves == AG_RMSNORM_HF_SQUARES) w->saved += rows * width * 4; // x² kept by MeanBackward1
    }
    return cf_new(w->BT * width * w->a, x->grad);
}

// Projection p on x [B, T, in] into [B, T, out]: the frozen base, and the adapter if p is a target.
static cf_t cf_proj(cf_walk *w, cf_t *x, llama_proj p, uint64_t in, uint64_t out) {
    if (!(w->l->targets & (1u << p))) return cf_new(w->BT * out * w->a, x->grad);
    // float32 adapters beside a 16-bit base get x.to(float32), a tensor of its own; what the ops make
    // of it is float32 where each tensor has its own dtype (typed_tensors), else the run's
    const uint64_t cb = w->l->adapter_bits ? (uint64_t)w->l->adapter_bits / 8 : w->a,
                   ab = AG_FW(w->fw, typed_tensors) ? cb : w->a;
    cf_t d, cast;
    cf_t *hp = x;
    if (cb != w->a) {
        cast = cf_new(w->BT * in * cb, x->grad);
        hp = &cast;
    }
    if (w->l->dropout > 0) {
        if (AG_FW(w->fw, dropout_mask) && x->grad) w->saved += w->BT * in; // the one-byte mask
        d = cf_new(w->BT * in * ab, x->grad);
        hp = &d;
    }
    cf_keep(w, hp);                                // A's input, for dA
    w->saved += w->BT * (uint64_t)w->l->rank * ab; // A's output, for dB
    return cf_new(w->BT * out * w->a, true);
}

// One block on x; returns the block's output.
static cf_t cf_block(cf_walk *w, cf_t *x) {
    const uint64_t start = w->saved;
    const llama_config *c = w->c;
    const uint64_t H = (uint64_t)c->hidden, I = (uint64_t)c->intermediate, hq = (uint64_t)c->heads,
                   hkv = (uint64_t)c->kv_heads, D = (uint64_t)c->head_dim, Q = hq * D, KV = hkv * D;
    const uint64_t BT = w->BT, a = w->a, B = w->B, T = w->T;
    cf_t h = cf_norm(w, x, BT, H);
    cf_t q = cf_proj(w, &h, LLAMA_PROJ_Q, H, Q), k = cf_proj(w, &h, LLAMA_PROJ_K, H, KV),
         v = cf_proj(w, &h, LLAMA_PROJ_V, H, KV);
    if (c->qk_norm) {
        q = cf_norm(w, &q, BT * hq, D);
        k = cf_norm(w, &k, BT * hkv, D);
    }
    cf_t qr = cf_new(BT * Q * a, q.grad), kr = cf_new(BT * KV * a, k.grad);
    if (AG_FW(w->fw, rope_tables) && (q.grad || k.grad)) w->tables = true;
    const bool rec = qr.grad || kr.grad || v.grad;
    cf_t o = cf_new(BT * Q * a, rec);
    if (rec && w->flash) {
        cf_keep(w, &qr), cf_keep(w, &kr), cf_keep(w, &v);
        if (AG_FW(w->fw, flash) == AG_FLASH_SDPA)
            w->saved += B * hq * T * D * a; // SDPA's own output; o is its transposed copy
        else
            cf_keep(w, &o);
        w->saved += B * hq * T * 4; // log-sum-exp
    } else if (rec && AG_FW(w->fw, attention) == AG_ATTENTION_OPS_HF_EAGER) {
        if (B > 1)
            w->saved += B * hq * T * D * a; // q's contiguous copy
        else
            cf_keep(w, &qr);
        // k and v repeated to every query head (repeat_kv's or the matmuls' copies), or kept as
        // they are; the scaling scalar
        if (ag_eager_kv_layout(w->fw, (int64_t)B, (int)c->heads, (int)c->kv_heads) == AG_KV_IN_PLACE)
            cf_keep(w, &kr), cf_keep(w, &v);
        else
            w->saved += 2 * B * hq * T * D * a;
        w->saved += 8;
        // As softmax makes the float32 probabilities, the masked scores (and their float32 copy
        // in a 16-bit model) are live, and so are the block's input, q, k and v (the forward's
        // locals and the cache) where nothing keeps them.
        w->att = w->saved - start + B * hq * T * T * (a + (a < 4 ? 4 : 0) + 4) + (x->kept ? 0 : x->bytes) +
                 (qr.kept ? 0 : qr.bytes) + (kr.kept ? 0 : kr.bytes) + (v.kept ? 0 : v.bytes);
        w->saved += B * hq * T * T * 4;            // float32 probabilities
        if (a < 4) w->saved += B * hq * T * T * a; // their cast to q's dtype
    } else if (rec) {
        if (kr.grad) cf_keep(w, &qr);
        if (qr.grad) cf_keep(w, &kr);
        cf_keep(w, &v);
        w->saved += B * hq * T * T * a; // probabilities
    }
    // DynamicCache.update keeps the layer's k (after RoPE) and v until the forward's output goes
    if (AG_FW(w->fw, output_cache) && !w->checkpointing && !c->no_cache)
        w->cache += (kr.kept ? 0 : kr.bytes) + (v.kept ? 0 : v.bytes);
    w->pre_o = w->saved - start;
    cf_t po = cf_proj(w, &o, LLAMA_PROJ_O, Q, H);
    cf_t r = cf_new(BT * H * a, x->grad || po.grad);
    cf_t h2 = cf_norm(w, &r, BT, H);
    cf_t g = cf_proj(w, &h2, LLAMA_PROJ_GATE, H, I), u = cf_proj(w, &h2, LLAMA_PROJ_UP, H, I);
    if (g.grad) cf_keep(w, &g); // silu's input
    cf_t s = cf_new(BT * I * a, g.grad);
    if (u.grad) cf_keep(w, &s);
    if (s.grad) cf_keep(w, &u);
    cf_t m = cf_new(BT * I * a, s.grad || u.grad);
    cf_t dn = cf_proj(w, &m, LLAMA_PROJ_DOWN, I, H);
    return cf_new(BT * H * a, r.grad || dn.grad);
}

void llama_closed_form_lora_activations(const llama_config *c, const llama_lora_config *l, int64_t batch, int64_t seq,
                                        const llama_dtype_bytes *d, ag_framework fw, bool flash, bool checkpointing,
                                        llama_lora_act_form *out) {
    memset(out, 0, sizeof *out);
    const uint64_t B = (uint64_t)batch, T = (uint64_t)seq, BT = B * T, H = (uint64_t)c->hidden, V = (uint64_t)c->vocab,
                   D = (uint64_t)c->head_dim, L = (uint64_t)c->layers, a = d->activation;
    cf_walk w = {c, l, BT, B, T, a, ag_framework_row_of(fw), flash, checkpointing, 0, false, 0, 0, 0};
    const ag_loss_ops loss = AG_FW(w.fw, loss);
    const bool hf_loss = loss == AG_LOSS_HF;
    const uint64_t N = B * (T - 1);
    // Gemma 2's norms around each sub-block and its soft-caps, phi3's fused projections, a sparse
    // block's router and experts under adapters are not walked here: said, not guessed
    out->closed = !checkpointing && !c->ff_norms && !c->fused_proj && c->moe.experts <= 0;
    // Block 0 on the embedding's output (no gradient), then a block on the residual stream.
    cf_t x0 = cf_new(BT * H * a, false);
    cf_t x1 = cf_block(&w, &x0);
    const uint64_t att_first = w.att;
    out->act_first_block = w.saved;
    const uint64_t cache_first = w.cache;
    w.saved = w.cache = 0;
    cf_t xs = cf_new(BT * H * a, true);
    cf_t y = cf_block(&w, &xs);
    out->act_block = w.saved;
    const uint64_t cache_block = w.cache, att_last = L > 1 ? w.att : 0, pre_o_last = w.pre_o;
    (void)x1;
    // The head at the start of backward: the final norm's saved set on the last block's output,
    // and the loss's.
    w.saved = 0;
    cf_t last = L > 1 ? y : x1;
    cf_norm(&w, &last, BT, H);
    const uint64_t norm_saved = w.saved;
    if (hf_loss)
        // ForCausalLMLoss: the float32 log_softmax kept, nll_loss's dense float32 gradient and
        // log_softmax's (or the logits' float32 one), the loss, total_weight and d(loss)
        w.saved += 3 * BT * V * 4 + 12;
    else if (loss == AG_LOSS_SHIFTED)
        // Qwen (v1)'s: log_softmax of the N shifted rows kept, nll_loss's and log_softmax's
        // gradients in the logits' dtype (total_weight gone with NllLossBackward), the loss and
        // d(loss); SliceBackward's [B, T, V] comes once the first two are freed (2 N V a at most)
        w.saved += 3 * N * V * a + 2 * a;
    else
        // the logits, kept by the loss, and their gradient; a float32 log-sum-exp per predicting
        // row; the loss and d(loss)
        w.saved += 2 * BT * V * a + B * (T - 1) * 4 + 2 * a;
    // Under checkpointing the head's moment here leaves out what the PyTorch frameworks' layers keep
    // beside their inputs (the rotary tables, the mask and positions, an RNG state each: the row's
    // checkpoint_args and checkpoint_rng_state); the meta run bills them.
    if (w.tables && !checkpointing) w.saved += 2 * T * D * a;
    out->act_head = w.saved;
    out->checkpointing = checkpointing;
    if (!checkpointing) {
        const uint64_t blocks = out->act_first_block + (L - 1) * out->act_block;
        out->activations = blocks + out->act_head;
        // The PyTorch frameworks' other moment, the forward's end as ForCausalLMLoss makes
        // total_weight: beside the saved sets, the DynamicCache, the last hidden state (held by the
        // base model's output), the logits and their float32 copy, the int64 labels (padded and,
        // when batch > 1, shifted: the shifted copy stays), log_softmax, the loss and total_weight.
        if (hf_loss) {
            out->act_forward_end = blocks + cache_first + (L - 1) * cache_block + norm_saved +
                                   (AG_FW(w.fw, output_holds_hidden) ? BT * H * a : 0) + BT * V * a +
                                   (a < 4 ? BT * V * 4 : 0) + 8 * (B > 1 ? BT : B * (T + 1)) + BT * V * 4 + 8 +
                                   (w.tables ? 2 * T * D * a : 0);
            if (out->act_forward_end > out->activations) out->activations = out->act_forward_end;
        } else if (loss == AG_LOSS_SHIFTED) {
            // the same moment for Qwen (v1)'s loss: the logits, their shifted copy and int64
            // labels when batch > 1, log_softmax, the loss and total_weight
            out->act_forward_end = blocks + cache_first + (L - 1) * cache_block + norm_saved +
                                   (AG_FW(w.fw, output_holds_hidden) ? BT * H * a : 0) + BT * V * a +
                                   (B > 1 ? N * V * a + 8 * N : 0) + N * V * a + 2 * a +
                                   (w.tables ? 2 * T * D * a : 0);
            if (out->act_forward_end > out->activations) out->activations = out->act_forward_end;
        }
        // PyTorch's eager attention: the last block's softmax in forward, beside every earlier
        // block's saved set and cache, the causal mask(s) and the rotary tables. Current
        // transformers makes [B, 1, T, T] (a second one for Qwen's sliding layers), 1.13 [T, T + 1].
        if (AG_FW(w.fw, attention) == AG_ATTENTION_OPS_HF_EAGER && !flash) {
            const bool old = AG_FW(w.fw, mask) == AG_MASK_T_T1,
                       qwen = c->family == LLAMA_FAMILY_QWEN2 || c->family == LLAMA_FAMILY_QWEN3,
                       sliding = c->sliding_window > 0 && c->window_from < c->layers;
            const uint64_t mask = (old ? T * (T + 1) : BT * T) * a * (!old && qwen && sliding ? 2 : 1);
            out->act_forward_softmax = (L > 1 ? out->act_first_block + (L - 2) * out->act_block + cache_first +
                                                    (L - 2) * cache_block + att_last
                                              : att_first) +
                                       mask + 2 * T * D * a;
            if (out->act_forward_softmax > out->activations) out->activations = out->act_forward_softmax;
            // and the last block's attention backward, its MLP and o_proj done: the gradients of
            // the residual stream and of the attention's output beside d(probs) and d(v
            // repeated), then d(scores); then, d(probs) freed, q's and k's gradients and d(k
            // repeated). Every earlier block's saved set is still there, and the loss.
            const uint64_t hq = (uint64_t)c->heads, Q = hq * D, KV = (uint64_t)c->kv_heads * D, P = B * hq * T * T * a,
                           KR = B * hq * T * D * a;
            const uint64_t dS = P + KR + P, dK = KR + P + BT * Q * a + BT * KV * a + KR;
            if (L > 1)
                out->act_backward_attention = out->act_first_block + (L - 2) * out->act_block + pre_o_last +
                                              (w.tables ? 2 * T * D * a : 0) + BT * H * a + BT * Q * a +
                                              (dS > dK ? dS : dK) + 4;
            if (out->act_backward_attention > out->activations) out->activations = out->act_backward_attention;
        }
        return;
    }
    // Checkpointing keeps each block's input through forward; at the head's moment that is all
    // that stays of the blocks. The other candidate, the last block recomputed and
    // backpropagated, holds its saved set beside its backward's gradient buffers, which under
    // LoRA depend on the order in which the adapted projections' gradients are summed: that
    // moment is not closed here, so neither is the peak (act_recompute stays 0, closed false).
    out->act_block_inputs = L * BT * H * a;
    out->activations = out->act_block_inputs + out->act_head;
}
