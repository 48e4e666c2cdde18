// attention under PYTORCH semantics: transformers' eager_attention_forward, op by op, as PyTorch
// allocates it. k and v go to the products as the row's kv_heads says (repeat_kv's copies at
// every query head when grouped; else the heads themselves, or the matmuls' own copies);
// the scores are materialised three times (matmul, `* scaling`, `+ causal_mask`), the softmax
// output is kept, the context goes through bmm and transpose(1, 2).contiguous(). Backward
// allocates what PyTorch's nodes do: dP and dV at every query head, the softmax backward, the
// scaled scores' gradient, dK at every query head, then the sums over each group.
#include <math.h>
#include <string.h>

#include "ag_ops.h"

// [B, H, T, D] contiguous: one (batch, head) slice.
#define BH(base, b, h, H, T, D) ag_buf_at(base, (((b) * (H) + (h)) * (T)) * (D))

// A block of the activations' dtype (how blocks() bills it).
static ag_buf blk(const ag_ctx *ctx, mp_block *b) {
    return (ag_buf){b->data, ag_dtype_of_bits(ctx->dtype.act_bits, ctx->dtype.fp16)};
}

// dst[B, T, Hs*D] (+)= the sum over each group of src[B, Hq, T, D], in float32.
static void from_heads(ag_buf dst, bool fresh, ag_buf src, int64_t B, int64_t T, int Hq, int Hs, int D) {
    int rep = Hq / Hs;
    float ob[D], sb[D];
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            for (int g = 0; g < Hs; g++) {
                int64_t at = ((b * T + t) * Hs + g) * D;
                float *o = fresh ? ag_wr(dst, at, ob) : ag_rw(dst, at, D, ob);
                if (fresh) memset(o, 0, (size_t)D * sizeof(float));
                for (int r = 0; r < rep; r++) {
                    const float *x = ag_rd(BH(src, b, g * rep + r, Hq, T, D), t * D, D, sb);
                    for (int j = 0; j < D; j++) o[j] += x[j];
                }
                ag_wr_end(dst, at, D, o);
            }
}

// Q of one (batch, head): the rope output [B, Tq, Hq*D] itself (B = 1) or its copy [B, Hq, Tq, D].
static ag_buf q_head(const ag_tensor *q, bool copied, const ag_att_dims *a, int64_t b, int h, int64_t *ld) {
    *ld = copied ? a->D : (int64_t)a->Hq * a->D;
    return copied ? BH(ag_buf_of(q), b, h, a->Hq, a->Tq, a->D)
                  : ag_buf_at(ag_buf_of(q), (b * a->Tq * a->Hq + h) * a->D);
}

// K or V of one (batch, query head) as the products read it: a [B, Hq, Tk, D] copy, or the
// key-value heads in place [B, Tk, Hkv*D], query head h reading head h / (Hq / Hkv).
static ag_buf kv_head(const ag_tensor *t, const ag_att_dims *a, int64_t b, int h, int64_t *ld) {
    const bool in_place = t->ndim == 3;
    *ld = in_place ? (int64_t)a->Hkv * a->D : a->D;
    return in_place ? ag_buf_at(ag_buf_of(t), (b * a->Tk * a->Hkv + h / (a->Hq / a->Hkv)) * a->D)
                    : BH(ag_buf_of(t), b, h, a->Hq, a->Tk, a->D);
}

// The products skip what the causal mask hides (kernels/causal.c). The hidden scores are never
// read: the mask overwrites them, the probabilities there are 0, and the softmax backward writes
// 0 there.
static bool scores(ag_buf S, const ag_tensor *q, bool copied, const ag_tensor *k, const ag_att_dims *a) {
    bool ok = true;
    for (int64_t b = 0; b < a->B; b++)
        for (int h = 0; h < a->Hq; h++) {
            int64_t ldq, ldk;
            ag_buf qh = q_head(q, copied, a, b, h, &ldq), kh = kv_head(k, a, b, h, &ldk);
            ok = ok && ag_causal_scores(a, 1.0f, qh, ldq, kh, ldk, BH(S, b, h, a->Hq, a->Tq, a->Tk));
        }
    return ok;
}

// The row-wise passes over [B, Hq, Tq, Tk] between the products, split over the pool.
enum { ROWS_SCALE, ROWS_SOFTCAP, ROWS_MASK, ROWS_SOFTMAX_BWD };
typedef struct {
    int kind;
    ag_buf out, in, p; // p: the probabilities (ROWS_SOFTMAX_BWD); tanh's output (ROWS_SOFTCAP, and
                       // ROWS_SOFTMAX_BWD under a soft-cap)
    const ag_att_dims *a;
    float sc;
    ag_buf t; // ROWS_SOFTMAX_BWD under a soft-cap: tanh's output
} rows_args;

static void rows_part(void *arg, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const rows_args *x = arg;
    const int64_t n = x->a->Tk, Tq = x->a->Tq;
    float ob[n], ib[n], pb[n], tb[n];
    for (int64_t r = lo; r < hi; r++) {
        // The keys this query sees end at seen; the products left the scores past it unwritten.
        const int64_t seen = ag_keys_seen(x->a, r % Tq);
        float *o = ag_wr(x->out, r * n, ob);
        const float *in = ag_rd(x->in, r * n, n, ib),
                    *P = x->p.p && x->kind != ROWS_SOFTCAP ? ag_rd(x->p, r * n, n, pb) : NULL;
        if (x->kind == ROWS_SOFTCAP) { // tanh(in / c) into p, c tanh(in / c) into out
            float *t = ag_wr(x->p, r * n, pb);
            for (int64_t j = 0; j < n; j++) t[j] = j < seen ? tanhf(in[j] / x->sc) : 0.0f, o[j] = x->sc * t[j];
            ag_wr_end(x->p, r * n, n, t);
        } else if (x->kind == ROWS_SCALE) { // the hidden scores become 0 (the mask overwrites them)
            for (int64_t j = 0; j < n; j++) o[j] = j < seen ? in[j] * x->sc : 0.0f;
        } else if (x->kind == ROWS_MASK) { // scaled + the causal mask: -inf where a query may not
            // look (later keys, and keys the sliding window leaves behind)
            int64_t first = ag_window_first(seen - 1, x->a->window);
            for (int64_t j = 0; j < n; j++) o[j] = j < seen && j >= first ? in[j] : -INFINITY;
        } else { // SoftmaxBackward, then MulBackward (the scaling), each rounded as its own op;
            // 0 past seen, where the probabilities are 0
            ag_softmax_backward_row(o, in, P, seen);
            for (int64_t j = seen; j < n; j++) o[j] = 0.0f;
            if (x->t.p) { // MulBackward (* c), TanhBackward, DivBackward (/ c): their product
                const float *t = ag_rd(x->t, r * n, n, tb);
                for (int64_t j = 0; j < seen; j++) o[j] *= 1.0f - t[j] * t[j];
            }
            if (x->sc != 1.0f)
                for (int64_t j = 0; j < seen; j++) o[j] *= x->sc;
        }
        ag_wr_end(x->out, r * n, n, o);
    }
}

static void rows_pass(rows_args x) {
    const ag_att_dims *a = x.a;
    ag_parallel_for(a->B * a->Hq * a->Tq, AG_PAR_GRAIN / a->Tk + 1, rows_part, &x);
}

typedef struct {
    ag_buf p, m;
    const ag_att_dims *a;
} softmax_args;

// Past the keys a query sees the masked scores are -inf and their probabilities exactly 0.
static void softmax_part(void *arg, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const softmax_args *s = arg;
    const int64_t n = s->a->Tk;
    float xb[n], yb[n];
    for (int64_t r = lo; r < hi; r++) {
        const int64_t seen = ag_keys_seen(s->a, r % s->a->Tq);
        const float *x = ag_rd(s->m, r * n, n, xb);
        float *y = ag_wr(s->p, r * n, yb), mx = x[0];
        for (int64_t j = 1; j < seen; j++) mx = x[j] > mx ? x[j] : mx;
        float inv = (float)(1.0 / ag_softmax_exp(y, x, seen, mx, NULL));
        for (int64_t j = 0; j < seen; j++) y[j] *= inv;
        for (int64_t j = seen; j < n; j++) y[j] = 0.0f;
        ag_wr_end(s->p, r * n, n, y);
    }
}

static void softmax_rows(ag_buf p, ag_buf m, const ag_att_dims *a) {
    ag_parallel_for(a->B * a->Hq * a->Tq, AG_PAR_GRAIN_EXP / a->Tk + 1, softmax_part, &(softmax_args){p, m, a});
}

static ag_tensor *act_bits(ag_ctx *ctx, const char *base, const char *what, const int64_t shape[4], int bits) {
    char l[AG_LABEL_MAX];
    ag_label(l, base, what);
    return ag_tensor_new_bits(ctx, 4, shape, MP_ACTIVATION, l, bits);
}

// A [B, Hq, Tk, D] copy of k or v [B, Tk, Hkv*D] at bits an element, each query head its group's.
static ag_tensor *kv_copy(ag_ctx *ctx, const char *base, const char *what, const ag_tensor *t, const ag_att_dims *a,
                          int bits) {
    ag_tensor *c = act_bits(ctx, base, what, (int64_t[]){a->B, a->Hq, a->Tk, a->D}, bits);
    if (c && !mp_is_meta()) ag_to_heads(ag_buf_of(c), ag_buf_of(t), a->B, a->Tk, a->Hq, a->Hkv, a->D);
    return c;
}

// An operand of a matmul under autocast: a 16-bit cast of a wider tensor (t is released), else t.
// The key-value heads in place ([B, Tk, Hkv*D]) are cast to every query head, as casting
// repeat_kv's view gives.
static ag_tensor *autocast_operand(ag_ctx *ctx, const char *base, const char *what, ag_tensor *t,
                                   const ag_att_dims *a) {
    if (!t || !ag_autocast(ctx) || t->bits <= 16) return t;
    const bool heads = t->ndim == 3;
    ag_tensor *c = heads ? kv_copy(ctx, base, what, t, a, 16) : act_bits(ctx, base, what, t->shape, 16);
    if (c && !heads && !mp_is_meta()) ag_vec_copy(ag_buf_of(c), ag_buf_of(t), t->numel);
    ag_release(t);
    return c;
}

// What repeat_kv and the matmuls make of k and v (ag_eager_kv_layout): copies at every query head
// by repeat_kv (before anything else), or by the matmuls themselves (k by the score matmul, v by
// probs @ v), or none.
typedef struct {
    bool repeated, bmm_copies;
} kv_plan;

static kv_plan plan_kv(const ag_ctx *ctx, const ag_att_dims *a) {
    ag_kv_layout l = ag_eager_kv_layout(ctx->fw, a->B, a->Hq, a->Hkv);
    return (kv_plan){l == AG_KV_REPEATED, l == AG_KV_MATMUL_COPIES};
}

static void eager_backward(ag_ctx *ctx, ag_node *n, const void *dout);

static const ag_op eager_op = {.name = "attention", .backward = eager_backward, .nsaved = AG_NSAVED(attention)};

static bool context(ag_buf o, ag_buf probs, const ag_tensor *v, const ag_att_dims *a) {
    bool ok = true;
    for (int64_t b = 0; b < a->B; b++)
        for (int h = 0; h < a->Hq; h++) {
            int64_t ldv;
            ag_buf vh = kv_head(v, a, b, h, &ldv);
            ok = ok && ag_causal_rows(a, 1.0f, BH(probs, b, h, a->Hq, a->Tq, a->Tk), vh, ldv, 0.0f,
                                      BH(o, b, h, a->Hq, a->Tq, a->D), a->D);
        }
    return ok;
}

// out[B, Tq, Hq*D] = ctx[B, Hq, Tq, D].transpose(1, 2).contiguous()
static void untranspose(ag_buf out, ag_buf c, const ag_att_dims *a) {
    for (int64_t b = 0; b < a->B; b++)
        for (int h = 0; h < a->Hq; h++)
            for (int64_t t = 0; t < a->Tq; t++)
                ag_copy_elems(ag_buf_at(out, ((b * a->Tq + t) * a->Hq + h) * a->D).p, out.t,
                              ag_buf_at(BH(c, b, h, a->Hq, a->Tq, a->D), t * a->D).p, c.t, a->D);
}

#define SWAP_FREE(t) (ag_release(t), (t) = NULL)

// Gemma 2's soft-cap of the scaled scores (taken over): / softcap (freed once tanh has it), tanh
// (*tanh, kept by TanhBackward), * softcap (returned).
static ag_tensor *eager_softcap(ag_ctx *ctx, const char *base, ag_tensor *scaled, ag_tensor **tanh,
                                const ag_att_dims *a) {
    if (!scaled) return NULL;
    ag_tensor *div = act_bits(ctx, base, "scores_div", scaled->shape, scaled->bits);
    *tanh = div ? act_bits(ctx, base, "scores_tanh", scaled->shape, scaled->bits) : NULL;
    ag_release(div);
    ag_tensor *capped = *tanh ? act_bits(ctx, base, "scores_capped", scaled->shape, scaled->bits) : NULL;
    if (capped && !mp_is_meta())
        rows_pass((rows_args){ROWS_SOFTCAP, ag_buf_of(capped), ag_buf_of(scaled), ag_buf_of(*tanh), a, a->softcap, {0}});
    ag_release(scaled);
    return capped;
}

// The scores: S = q k_repᵀ, scaled = S * scaling (S freed), [Gemma 2: capped, eager_softcap],
// masked = scaled + mask (scaled freed), probs = softmax(masked, dtype=float32) (masked freed). Returns probs
// (float32); *scale gets the 8-byte scalar. The mask has the model's dtype, so a 16-bit S added to autocast's float32
// mask is float32; softmax converts a 16-bit input to float32 first.
static ag_tensor *eager_probs(ag_ctx *ctx, const char *base, const ag_tensor *qk, bool copied, const ag_tensor *krep,
                              const ag_att_dims *a, ag_tensor **scale, ag_tensor **tanh) {
    const bool meta = mp_is_meta();
    const int64_t sh[4] = {a->B, a->Hq, a->Tq, a->Tk};
    const int sbits = ag_autocast(ctx) ? 16 : qk->bits, mbits = ag_max_bits(sbits, ctx->dtype.act_bits);
    ag_tensor *S = act_bits(ctx, base, "scores", sh, sbits);
    if (S && !meta && !scores(ag_buf_of(S), qk, copied, krep, a))
        ag_fail(ctx, AG_ERR_NOMEM, "attention %s: out of memory for a conversion", base);
    char l[AG_LABEL_MAX];
    ag_label(l, base, "scaling");
    *scale = ag_tensor_new_f32(ctx, 1, (int64_t[]){2}, MP_ACTIVATION, l); // a float64 scalar: 8 bytes
    ag_tensor *scaled = act_bits(ctx, base, "scores_scaled", sh, sbits);
    const float sc = ag_att_scale(a);
    if (S && scaled && !meta) rows_pass((rows_args){ROWS_SCALE, ag_buf_of(scaled), ag_buf_of(S), {0}, a, sc, {0}});
    SWAP_FREE(S);
    if (a->softcap > 0.0f) scaled = eager_softcap(ctx, base, scaled, tanh, a);
    ag_tensor *masked = act_bits(ctx, base, "scores_masked", sh, mbits);
    if (scaled && masked && !meta)
        rows_pass((rows_args){ROWS_MASK, ag_buf_of(masked), ag_buf_of(scaled), {0}, a, 1.0f, {0}});
    SWAP_FREE(scaled);
    ag_tensor *wide = mbits < 32 ? act_bits(ctx, base, "scores_float", sh, 32) : NULL;
    ag_tensor *probs = act_bits(ctx, base, "probs", sh, 32);
    if (wide && !meta) ag_vec_copy(ag_buf_of(wide), ag_buf_of(masked), masked->numel);
    if (masked && probs && !meta) softmax_rows(ag_buf_of(probs), ag_buf_of(wide ? wide : masked), a);
    SWAP_FREE(wide);
    SWAP_FREE(masked);
    return ctx->status == AG_OK ? probs : (ag_release(probs), NULL);
}

ag_tensor *ag_attention_eager(ag_ctx *ctx, const ag_site *s, ag_tensor *q, ag_tensor *k, ag_tensor *v,
                              const ag_att_dims *a, bool rec) {
    const bool meta = mp_is_meta(), cast = ag_autocast(ctx);
    const int64_t B = a->B, Hq = a->Hq, Tq = a->Tq, D = a->D;
    const int64_t q_shape[4] = {B, Hq, Tq, D};
    const kv_plan kp = plan_kv(ctx, a);
    ag_tensor *krep = kp.repeated ? kv_copy(ctx, s->base, "k_repeated", k, a, k->bits) : ag_retain(k);
    ag_tensor *vrep = kp.repeated ? kv_copy(ctx, s->base, "v_repeated", v, a, v->bits) : ag_retain(v);
    // The score matmul's operands. B > 1: it cannot view q [B, Hq, Tq, D] (laid out [B, Tq, Hq, D])
    // as a batch of matrices, so it keeps a contiguous copy instead of q (autocast's cast is one),
    // and of k where repeat_kv made none.
    const bool copied = B > 1 || (cast && q->bits > 16);
    ag_tensor *qk =
        !copied ? ag_retain(q)
                : act_bits(ctx, s->base, cast && q->bits > 16 ? "q_bf16" : "q_bmm", q_shape, cast ? 16 : q->bits);
    if (copied && qk && !meta) ag_to_heads(ag_buf_of(qk), ag_buf_of(q), B, Tq, a->Hq, a->Hq, a->D);
    if (kp.bmm_copies && krep) {
        ag_release(krep);
        krep = kv_copy(ctx, s->base, "k_bmm", k, a, k->bits);
    }
    krep = autocast_operand(ctx, s->base, "k_bf16", krep, a);
    ag_tensor *scale = NULL, *tanh = NULL,
              *probs = krep && vrep && qk ? eager_probs(ctx, s->base, qk, copied, krep, a, &scale, &tanh) : NULL;
    // probs @ v: `.to(query.dtype)` casts a 16-bit model's probabilities back; autocast casts both.
    ag_tensor *pc = NULL;
    if (probs && (q->bits < 32 || cast))
        pc = act_bits(ctx, s->base, cast ? "probs_bf16" : "probs_to_q_dtype", probs->shape, cast ? 16 : q->bits);
    if (pc && !meta) ag_vec_copy(ag_buf_of(pc), ag_buf_of(probs), probs->numel);
    if (kp.bmm_copies && vrep && probs) {
        ag_release(vrep);
        vrep = kv_copy(ctx, s->base, "v_bmm", v, a, v->bits);
    }
    vrep = autocast_operand(ctx, s->base, "v_bf16", vrep, a);
    const int cbits = cast ? 16 : (pc ? pc->bits : 32);
    ag_tensor *c = probs ? act_bits(ctx, s->base, "context", q_shape, cbits) : NULL;
    if (c && vrep && !meta && !context(ag_buf_of(c), ag_buf_of(pc ? pc : probs), vrep, a))
        ag_fail(ctx, AG_ERR_NOMEM, "attention %s: out of memory for a conversion", s->base);
    ag_tensor *out = c ? ag_tensor_new_bits(ctx, 3, (int64_t[]){B, Tq, Hq * D}, MP_ACTIVATION, s->out, cbits) : NULL;
    if (out && !meta) untranspose(ag_buf_of(out), ag_buf_of(c), a);
    ag_release(c);
    ag_tensor *ins[] = {q, k, v};
    ag_node *n = out && vrep && rec && ctx->status == AG_OK ? ag_record(ctx, &eager_op, s->base, out, 3, ins) : NULL;
    if (n) {
        n->state.attention = (ag_attention_state){.q = qk,
                                                  .probs = probs,
                                                  .k_rep = krep,
                                                  .v_rep = vrep,
                                                  .scale = scale,
                                                  .probs_cast = pc,
                                                  .tanh = tanh,
                                                  .dims = *a};
        return out;
    }
    ag_release(qk), ag_release(probs), ag_release(krep), ag_release(vrep), ag_release(scale), ag_release(pc);
    ag_release(tanh);
    if (rec || ctx->status != AG_OK) ag_release(out), out = NULL; // no node: failed, or no grad
    return out;
}

static bool blocks(ag_ctx *ctx, const char *base, mp_block *b, const char *what, size_t bytes) {
    char l[AG_LABEL_MAX];
    ag_label(l, base, what);
    return ag_alloc_block(ctx, b, bytes, MP_ACTIVATION, l);
}

// BmmBackward (probs @ v_rep): dP = dO v_repᵀ, dV_rep = Pᵀ dO, at every query head.
// P is the probabilities as the product saw them (their cast to q's dtype, when there is one).
static bool bmm_backward(const ag_attention_state *st, ag_buf dout, ag_buf dP, ag_buf dV) {
    const ag_att_dims *a = &st->dims;
    int64_t ldo = (int64_t)a->Hq * a->D;
    bool ok = true;
    ag_buf probs = ag_buf_of(st->probs_cast ? st->probs_cast : st->probs);
    for (int64_t b = 0; b < a->B; b++)
        for (int h = 0; h < a->Hq; h++) {
            ag_buf dO = ag_buf_at(dout, (b * a->Tq * a->Hq + h) * a->D), P = BH(probs, b, h, a->Hq, a->Tq, a->Tk);
            ok = ok && ag_causal_keys(a, 1.0f, P, dO, ldo, 0.0f, BH(dV, b, h, a->Hq, a->Tk, a->D), a->D);
            int64_t ldv;
            ag_buf vh = kv_head(st->v_rep, a, b, h, &ldv);
            ok = ok && ag_causal_scores(a, 1.0f, dO, ldo, vh, ldv, BH(dP, b, h, a->Hq, a->Tq, a->Tk));
        }
    return ok;
}

// The score matmul's backward: dQ (+)= dS k_rep into q's gradient, dK_rep = dSᵀ Q.
static bool scores_backward(const ag_attention_state *st, ag_buf dS, const ag_grad_dst *dq, ag_buf dK) {
    const ag_att_dims *a = &st->dims;
    bool copied = st->q->ndim == 4, ok = true; // the forward's copy [B, Hq, Tq, D], else q itself
    int64_t ldo = (int64_t)a->Hq * a->D;
    for (int64_t b = 0; b < a->B; b++)
        for (int h = 0; h < a->Hq; h++) {
            ag_buf S = BH(dS, b, h, a->Hq, a->Tq, a->Tk);
            int64_t ldq, ldk;
            ag_buf qh = q_head(st->q, copied, a, b, h, &ldq), kh = kv_head(st->k_rep, a, b, h, &ldk);
            if (dq->needed)
                ok = ok && ag_causal_rows(a, 1.0f, S, kh, ldk, dq->fresh ? 0.0f : 1.0f,
                                          ag_buf_at(ag_dst_buf(dq), (b * a->Tq * a->Hq + h) * a->D), ldo);
            if (dK.p) ok = ok && ag_causal_keys(a, 1.0f, S, qh, ldq, 0.0f, BH(dK, b, h, a->Hq, a->Tk, a->D), a->D);
        }
    return ok;
}

static void eager_backward(ag_ctx *ctx, ag_node *n, const void *dout) {
    const ag_attention_state *st = &n->state.attention;
    const ag_att_dims *a = &st->dims;
    const char *base = mp_site_name(n->site);
    const bool meta = mp_is_meta();
    size_t scores_bytes = (size_t)(a->B * a->Hq * a->Tq * a->Tk) * sizeof(float);
    size_t kv_bytes = (size_t)(a->B * a->Hq * a->Tk * a->D) * sizeof(float);
    mp_block dP = {0}, dV = {0}, dS = {0}, dK = {0};
    ag_grad_dst d[3];
    if (!blocks(ctx, base, &dP, "dprobs", scores_bytes) || !blocks(ctx, base, &dV, "dv_repeated", kv_bytes)) goto done;
    bool ok = meta || bmm_backward(st, (ag_buf){(void *)dout, n->grad_dtype}, blk(ctx, &dP), blk(ctx, &dV));
    if (!blocks(ctx, base, &dS, "dscores", scores_bytes)) goto done;
    if (!meta)
        rows_pass((rows_args){ROWS_SOFTMAX_BWD, blk(ctx, &dS), blk(ctx, &dP), ag_buf_of(st->probs), a, ag_att_scale(a),
                              ag_buf_of(st->tanh)});
    mp_free(&dP);
    if (!ag_grad_get(ctx, n, 0, &d[0]) || !ag_grad_get(ctx, n, 1, &d[1])) goto done;
    if (d[1].needed && !blocks(ctx, base, &dK, "dk_repeated", kv_bytes)) goto done;
    ok = ok && (meta || scores_backward(st, blk(ctx, &dS), &d[0], d[1].needed ? blk(ctx, &dK) : (ag_buf){0}));
    mp_free(&dS);
    if (d[1].needed && !meta)
        from_heads(ag_dst_buf(&d[1]), d[1].fresh, blk(ctx, &dK), a->B, a->Tk, a->Hq, a->Hkv, a->D);
    mp_free(&dK);
    if (ag_grad_get(ctx, n, 2, &d[2]) && d[2].needed && !meta)
        from_heads(ag_dst_buf(&d[2]), d[2].fresh, blk(ctx, &dV), a->B, a->Tk, a->Hq, a->Hkv, a->D);
    if (!ok) ag_fail(ctx, AG_ERR_NOMEM, "attention %s backward: out of memory for a conversion", base);
done:
    mp_free(&dK), mp_free(&dS), mp_free(&dV), mp_free(&dP);
}
