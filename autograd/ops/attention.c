// attention: causal grouped-query attention, eager (the probabilities are materialised, as
// PyTorch's default path for Llama does). q[B, Tq, Hq*D], k and v [B, Tk, Hkv*D]; query head h
// reads key-value head h / (Hq/Hkv); query i sits at position i + Tk - Tq and sees keys up to it.
//   S = Q Kᵀ / sqrt(D) (masked), P = softmax(S) rows, O = P V
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ag_ops.h"

// Pointers to one (batch, head) slice; rows are strided by the width of all heads.
#define QH(base, a, b, h) ag_buf_at(base, ((b) * (a).Tq * (a).Hq + (h)) * (a).D)
#define KH(base, a, b, g) ag_buf_at(base, ((b) * (a).Tk * (a).Hkv + (g)) * (a).D)
#define PH(base, a, b, h) ag_buf_at(base, ((b) * (a).Hq + (h)) * (a).Tq * (a).Tk)

// In place over one row of scores (query i): causal softmax (within the sliding window, if
// any); masked entries become zeros. A sink (gpt_oss; NULL: none) is one more logit in the
// denominator, with no value: the row's probabilities then sum to less than 1.
static void causal_softmax_row(float *row, int64_t i, const ag_att_dims *a, const float *sink) {
    int64_t n = ag_keys_seen(a, i);                 // keys 0 .. i + Tk - Tq are visible
    int64_t lo = ag_window_first(n - 1, a->window); // ... from this one on
    if (a->softcap > 0.0f)
        for (int64_t j = lo; j < n; j++) row[j] = a->softcap * tanhf(row[j] / a->softcap);
    float mx = row[lo];
    for (int64_t j = lo + 1; j < n; j++) mx = row[j] > mx ? row[j] : mx;
    if (sink && *sink > mx) mx = *sink;
    double sum = ag_softmax_exp(row + lo, row + lo, n - lo, mx, NULL) + (sink ? exp((double)(*sink - mx)) : 0.0);
    float inv = (float)(1.0 / sum);
    for (int64_t j = lo; j < n; j++) row[j] *= inv;
    for (int64_t j = 0; j < lo; j++) row[j] = 0.0f;
    for (int64_t j = n; j < a->Tk; j++) row[j] = 0.0f;
}

typedef struct {
    ag_buf probs;
    const ag_att_dims *a;
    const float *sinks; // [Hq] float32, NULL: none
} softmax_args;

static void softmax_part(void *p, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const softmax_args *s = p;
    int64_t n = s->a->Tk;
    float buf[n];
    for (int64_t r = lo; r < hi; r++) {
        float *row = ag_rw(s->probs, r * n, n, buf);
        causal_softmax_row(row, r % s->a->Tq, s->a, s->sinks ? s->sinks + r / s->a->Tq % s->a->Hq : NULL);
        ag_wr_end(s->probs, r * n, n, row);
    }
}

// Three phases rather than one pass per head: each product and the softmax is then one loop of
// the pool over every head.
static bool attention_forward(ag_buf o, ag_buf probs, ag_buf q, ag_buf k, ag_buf v, const ag_att_dims *a,
                              const float *sinks) {
    bool ok = true;
    int rep = a->Hq / a->Hkv;
    int64_t ldq = (int64_t)a->Hq * a->D, ldk = (int64_t)a->Hkv * a->D;
    float scale = ag_att_scale(a);
    for (int64_t b = 0; b < a->B; b++)
        for (int h = 0; h < a->Hq; h++)
            ok =
                ok && ag_causal_scores(a, scale, QH(q, *a, b, h), ldq, KH(k, *a, b, h / rep), ldk, PH(probs, *a, b, h));
    int64_t rows = a->B * a->Hq * a->Tq;
    if (ok) ag_parallel_for(rows, AG_PAR_GRAIN_EXP / a->Tk + 1, softmax_part, &(softmax_args){probs, a, sinks});
    for (int64_t b = 0; b < a->B; b++)
        for (int h = 0; h < a->Hq; h++)
            ok = ok &&
                 ag_causal_rows(a, 1.0f, PH(probs, *a, b, h), KH(v, *a, b, h / rep), ldk, 0.0f, QH(o, *a, b, h), ldq);
    return ok;
}

typedef struct {
    ag_buf dp, p;
    const ag_att_dims *a;
    double *dsink; // [Tq]: each row's part of its head's sink gradient; NULL: no sink
} dsoftmax_args;

// Row i of one head; past the keys it sees, dP was left unwritten and dS is 0. With a sink,
// whose probability is 1 - Σ P and whose value is none: dsink = -p_sink Σ P ∘ dP.
static void dsoftmax_part(void *arg, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const dsoftmax_args *x = arg;
    const int64_t n = x->a->Tk;
    float db[n], pb[n];
    for (int64_t i = lo; i < hi; i++) {
        const int64_t seen = ag_keys_seen(x->a, i);
        float *dp = ag_rw(x->dp, i * n, n, db);
        const float *p = ag_rd(x->p, i * n, n, pb);
        if (x->dsink) {
            double total = 0.0;
            for (int64_t j = 0; j < seen; j++) total += p[j];
            x->dsink[i] = -(1.0 - total) * ag_dot_f64(p, dp, seen);
        }
        ag_softmax_backward_row(dp, dp, p, seen);
        for (int64_t j = seen; j < n; j++) dp[j] = 0.0f;
        ag_wr_end(x->dp, i * n, n, dp);
    }
}

// In place over one head: dP -> dS = P ∘ (dP - rowsum(P ∘ dP)), the softmax backward.
static void softmax_backward(ag_buf dp, ag_buf p, const ag_att_dims *a, double *dsink) {
    ag_parallel_for(a->Tq, AG_PAR_GRAIN / a->Tk + 1, dsoftmax_part, &(dsoftmax_args){dp, p, a, dsink});
}

// The soft-cap's derivative on one head's dS (in place): 1 - tanh²(S / c) from the scores
// recomputed into sc; 0 where the query does not look (dS is 0 there).
static void softcap_backward(ag_buf dp, const float *sc, const ag_att_dims *a) {
    const int64_t n = a->Tk;
    float db[n];
    for (int64_t i = 0; i < a->Tq; i++) {
        const int64_t seen = ag_keys_seen(a, i), lo = ag_window_first(seen - 1, a->window);
        float *row = ag_rw(dp, i * n, n, db);
        for (int64_t j = lo; j < seen; j++) {
            float t = tanhf(sc[i * n + j] / a->softcap);
            row[j] *= 1.0f - t * t;
        }
        ag_wr_end(dp, i * n, n, row);
    }
}

// One (batch, head): dV += Pᵀ dO; dP = dO Vᵀ; dS; dQ = dS K scale; dK += dSᵀ Q scale.
// dK and dV sum over the query heads of a group: the group's first head writes, if fresh.
// sc: a head's scores, recomputed under a soft-cap (NULL: none); dsink: [Tq] rows' parts of the
// head's sink gradient, NULL without a sink.
static bool attention_head_backward(const ag_grad_dst *d, ag_buf dout, ag_buf dp, float *sc,
                                    const ag_attention_state *st, int64_t b, int h, double *dsink) {
    const ag_att_dims *a = &st->dims;
    int rep = a->Hq / a->Hkv, g = h / rep;
    int64_t ldq = (int64_t)a->Hq * a->D, ldk = (int64_t)a->Hkv * a->D;
    float scale = ag_att_scale(a);
    ag_buf p = PH(ag_buf_of(st->probs), *a, b, h), dO = QH(dout, *a, b, h);
    bool first = h % rep == 0, ok = true;
    if (d[2].needed)
        ok = ag_causal_keys(a, 1.0f, p, dO, ldq, first && d[2].fresh ? 0.0f : 1.0f, KH(ag_dst_buf(&d[2]), *a, b, g),
                            ldk);
    if (!d[0].needed && !d[1].needed && !dsink) return ok;
    ok = ok && ag_causal_scores(a, 1.0f, dO, ldq, KH(ag_buf_of(st->v), *a, b, g), ldk, dp);
    if (ok) softmax_backward(dp, p, a, dsink);
    if (ok && sc) {
        ok = ag_causal_scores(a, scale, QH(ag_buf_of(st->q), *a, b, h), ldq, KH(ag_buf_of(st->k), *a, b, g), ldk,
                              ag_buf_f32(sc));
        if (ok) softcap_backward(dp, sc, a);
    }
    if (d[0].needed)
        ok = ok && ag_causal_rows(a, scale, dp, KH(ag_buf_of(st->k), *a, b, g), ldk, d[0].fresh ? 0.0f : 1.0f,
                                  QH(ag_dst_buf(&d[0]), *a, b, h), ldq);
    if (d[1].needed)
        ok = ok && ag_causal_keys(a, scale, dp, QH(ag_buf_of(st->q), *a, b, h), ldq, first && d[1].fresh ? 0.0f : 1.0f,
                                  KH(ag_dst_buf(&d[1]), *a, b, g), ldk);
    return ok;
}

// Backward needs P for dV and for the softmax backward; V for dP (when q or k wants a
// gradient); K for dQ; Q for dK. Recomputing P would cost the forward's QKᵀ again: eager
// attention keeps it, which is why its memory grows with the square of the length.
static void attention_backward(ag_ctx *ctx, ag_node *n, const void *dout) {
    const ag_attention_state *st = &n->state.attention;
    ag_att_dims a = st->dims;
    ag_grad_dst d[3];
    if (!ag_grad_get_all(ctx, n, d)) return;
    mp_block dp = {0}, sc = {0}; // dP of one head, reused across heads; its recomputed scores
    char label[AG_LABEL_MAX], lsc[AG_LABEL_MAX];
    ag_label(label, mp_site_name(n->site), "dprobs");
    ag_label(lsc, mp_site_name(n->site), "capped_scores");
    bool need_dp = d[0].needed || d[1].needed, ok = true;
    const size_t head = (size_t)(a.Tq * a.Tk) * sizeof(float);
    if (need_dp && !ag_alloc_block(ctx, &dp, head, MP_ACTIVATION, label)) return;
    if (need_dp && a.softcap > 0.0f && !ag_alloc_exact(ctx, &sc, head, MP_ACTIVATION, lsc)) {
        mp_free(&dp);
        return;
    }
    ag_buf dpb = {dp.data, n->grad_dtype}, dy = {(void *)dout, n->grad_dtype};
    if (!mp_is_meta())
        for (int64_t b = 0; b < a.B; b++)
            for (int h = 0; h < a.Hq && ok; h++) ok = attention_head_backward(d, dy, dpb, sc.data, st, b, h, NULL);
    if (!ok) ag_fail(ctx, AG_ERR_NOMEM, "attention %s backward: out of memory for a conversion", mp_site_name(n->site));
    mp_free(&sc);
    mp_free(&dp);
}

static const ag_op attention_op = {.name = "attention", .backward = attention_backward, .nsaved = AG_NSAVED(attention)};

bool ag_attention_shapes(ag_ctx *ctx, const char *base, const ag_tensor *q, const ag_tensor *k, const ag_tensor *v,
                         int Hq, int Hkv, int D) {
    char sq[64], sk[64], sv[64];
    bool ok = Hq >= 1 && Hkv >= 1 && D >= 1 && Hq % Hkv == 0 && q->ndim == 3 && k->ndim == 3 && v->ndim == 3 &&
              q->shape[2] == (int64_t)Hq * D && k->shape[2] == (int64_t)Hkv * D && v->shape[0] == k->shape[0] &&
              v->shape[1] == k->shape[1] && v->shape[2] == k->shape[2] && q->shape[0] == k->shape[0] &&
              k->shape[1] >= q->shape[1];
    if (!ok)
        ag_fail(ctx, AG_ERR_SHAPE,
                "attention %s: q %s, k %s, v %s do not fit %d query heads, "
                "%d key-value heads of dimension %d (expected q[B, Tq, %lld], k and v "
                "[B, Tk, %lld], Tk >= Tq, key-value heads dividing query heads)",
                base, ag_shape_str(q, sq), ag_shape_str(k, sk), ag_shape_str(v, sv), Hq, Hkv, D, (long long)Hq * D,
                (long long)Hkv * D);
    return ok;
}

ag_tensor *ag_attention(ag_ctx *ctx, const char *site, ag_tensor *q, ag_tensor *k, ag_tensor *v, int Hq, int Hkv,
                        int D) {
    return ag_attention_window(ctx, site, q, k, v, Hq, Hkv, D, 0);
}

bool ag_attention_begin(ag_ctx *ctx, const char *site, ag_tensor *q, ag_tensor *k, ag_tensor *v, int Hq, int Hkv, int D,
                        int64_t window, ag_site *s, ag_att_dims *a) {
    ag_tensor *ins[] = {q, k, v};
    if (!ag_check_inputs(ctx, "attention", site, 3, ins, (const char *[]){"q", "k", "v"})) return false;
    ag_site_parse(s, site);
    if (!ag_attention_shapes(ctx, s->base, q, k, v, Hq, Hkv, D)) return false;
    *a = (ag_att_dims){q->shape[0], q->shape[1], k->shape[1], Hq, Hkv, D, window < 0 ? 0 : window, 0.0f, 0.0f};
    return true;
}

// The eager op's output and probabilities [B, Hq, Tq, Tk], and its node when an input wants a
// gradient (NULL otherwise); *o NULL on failure, with nothing left allocated.
static ag_node *eager_begin(ag_ctx *ctx, const ag_site *s, const ag_att_dims *a, const ag_op *op, int nin,
                            ag_tensor **ins, ag_tensor **o, ag_tensor **probs) {
    char label[AG_LABEL_MAX];
    ag_label(label, s->base, "probs");
    *o = ag_tensor_like(ctx, ins[0], MP_ACTIVATION, s->out);
    *probs = ag_tensor_new(ctx, 4, (int64_t[]){a->B, a->Hq, a->Tq, a->Tk}, MP_ACTIVATION, label);
    ag_node *n = NULL;
    if (*o && *probs && ag_any_needs_grad(ctx, nin, ins)) n = ag_record(ctx, op, s->base, *o, nin, ins);
    if (!*o || !*probs || ctx->status != AG_OK) {
        ag_release(*probs);
        ag_release(*o);
        *o = *probs = NULL;
        return NULL;
    }
    return n;
}

ag_tensor *ag_attention_window(ag_ctx *ctx, const char *site, ag_tensor *q, ag_tensor *k, ag_tensor *v, int Hq, int Hkv,
                               int D, int64_t window) {
    return ag_attention_spec_run(ctx, site, q, k, v, Hq, Hkv, D, &(ag_attention_spec){window, 0.0f, 0.0f});
}

ag_tensor *ag_attention_spec_run(ag_ctx *ctx, const char *site, ag_tensor *q, ag_tensor *k, ag_tensor *v, int Hq,
                                 int Hkv, int D, const ag_attention_spec *spec) {
    const bool plain = spec->scale == 0.0f && spec->softcap == 0.0f;
    if (ctx && ctx->attention != AG_ATTENTION_EAGER && plain)
        return ag_attention_flash_window(ctx, site, q, k, v, Hq, Hkv, D, spec->window);
    ag_site s;
    ag_att_dims a;
    if (!ag_attention_begin(ctx, site, q, k, v, Hq, Hkv, D, spec->window, &s, &a)) return NULL;
    if (ctx->attention != AG_ATTENTION_EAGER || spec->scale < 0.0f || spec->softcap < 0.0f) {
        ag_fail(ctx, AG_ERR_ARG, "attention %s: %s (scale %g, soft-cap %g)", s.base,
                ctx->attention != AG_ATTENTION_EAGER
                    ? "flash attention with a scale of its own or a soft-cap of the scores is not modelled (eager only)"
                    : "a scale and a soft-cap must be positive, or 0 for none",
                (double)(spec->scale > 0.0f ? spec->scale : 1.0f / sqrtf((float)D)), (double)spec->softcap);
        return NULL;
    }
    a.scale = spec->scale, a.softcap = spec->softcap;
    ag_tensor *ins[] = {q, k, v};
    if (AG_FW(ctx->fw, attention) == AG_ATTENTION_OPS_HF_EAGER)
        return ag_attention_eager(ctx, &s, q, k, v, &a, ag_any_needs_grad(ctx, 3, ins));
    ag_tensor *o, *probs;
    ag_node *n = eager_begin(ctx, &s, &a, &attention_op, 3, ins, &o, &probs);
    if (!o) return NULL;
    if (!mp_is_meta() &&
        !attention_forward(ag_buf_of(o), ag_buf_of(probs), ag_buf_of(q), ag_buf_of(k), ag_buf_of(v), &a, NULL))
        ag_fail(ctx, AG_ERR_NOMEM, "attention %s: out of memory for a conversion", s.base);
    if (n) {
        // under a soft-cap, backward recomputes the scores from both q and k
        bool dq = ag_wants_grad(n, 0) || (a.softcap > 0.0f && ag_wants_grad(n, 1)),
             dk = ag_wants_grad(n, 1) || (a.softcap > 0.0f && ag_wants_grad(n, 0));
        n->state.attention = (ag_attention_state){
            .q = ag_retain(dk ? q : NULL),
            .k = ag_retain(dq ? k : NULL),
            .v = ag_retain(dq || dk ? v : NULL),
            .probs = ag_retain(probs),
            .dims = a,
        };
    }
    ag_release(probs); // without a node (no-grad mode), the probabilities go now
    return o;
}

// The flash attention's entries (attention_flash.c computes it).
ag_tensor *ag_attention_flash(ag_ctx *ctx, const char *site, ag_tensor *q, ag_tensor *k, ag_tensor *v, int Hq, int Hkv,
                              int D) {
    return ag_attention_flash_window(ctx, site, q, k, v, Hq, Hkv, D, 0);
}

// A fused kernel: the one the context's device runs for its attention (its row). One that takes no
// grouped heads gets k and v through transformers' repeat_kv first.
ag_tensor *ag_attention_flash_window(ag_ctx *ctx, const char *site, ag_tensor *q, ag_tensor *k, ag_tensor *v, int Hq,
                                     int Hkv, int D, int64_t window) {
    ag_site s;
    ag_att_dims a;
    if (!ag_attention_begin(ctx, site, q, k, v, Hq, Hkv, D, window, &s, &a)) return NULL;
    const ag_sdpa_kernel *kr = ctx->attention == AG_ATTENTION_EAGER ? &ag_sdpa_fused : ag_ctx_sdpa(ctx);
    if (!kr) {
        ag_fail(ctx, AG_ERR_ARG, "attention %s: PyTorch has no such fused kernel on the %s", s.base,
                ctx->dev ? ctx->dev->name : "cpu");
        return NULL;
    }
    ag_tensor *ins[] = {q, k, v};
    if (AG_SDPA(kr, gqa) || Hq == Hkv)
        return ag_attention_flash_checked(ctx, &s, q, k, v, NULL, &a, ag_any_needs_grad(ctx, 3, ins));
    char l[AG_LABEL_MAX];
    ag_label(l, s.base, "k_repeated");
    ag_tensor *kr_ = ag_repeat_kv(ctx, l, k, Hkv, Hq / Hkv, D);
    ag_label(l, s.base, "v_repeated");
    ag_tensor *vr = kr_ ? ag_repeat_kv(ctx, l, v, Hkv, Hq / Hkv, D) : NULL;
    ag_tensor *out = NULL;
    if (vr) {
        a.Hkv = Hq;
        ag_tensor *rins[] = {q, kr_, vr};
        out = ag_attention_flash_checked(ctx, &s, q, kr_, vr, NULL, &a, ag_any_needs_grad(ctx, 3, rins));
    }
    ag_release(kr_), ag_release(vr);
    return out;
}

// ------------------------------------------------------------------------------------------------
// Attention sinks (gpt_oss): the same eager attention with one more logit per query head in each
// row's softmax denominator.

// The sinks' gradient: for each (batch, head), the rows' parts summed into dsinks[h].
static void sinks_backward(ag_ctx *ctx, ag_node *n, const void *dout) {
    const ag_attention_sinks_state *st = &n->state.attention_sinks;
    const ag_att_dims a = st->dims;
    ag_grad_dst d[4];
    if (!ag_grad_get_all(ctx, n, d)) return;
    const ag_attention_state view = {.q = st->q, .k = st->k, .v = st->v, .probs = st->probs, .dims = a};
    mp_block dp = {0};
    char label[AG_LABEL_MAX];
    ag_label(label, mp_site_name(n->site), "dprobs");
    if (!ag_alloc_block(ctx, &dp, (size_t)(a.Tq * a.Tk) * sizeof(float), MP_ACTIVATION, label)) return;
    if (mp_is_meta()) {
        mp_free(&dp);
        return;
    }
    double *rows = malloc((size_t)a.Tq * sizeof *rows), *dsink = calloc((size_t)a.Hq, sizeof *dsink);
    ag_buf dpb = {dp.data, n->grad_dtype}, dy = {(void *)dout, n->grad_dtype};
    bool ok = rows && dsink;
    for (int64_t b = 0; b < a.B && ok; b++)
        for (int h = 0; h < a.Hq && ok; h++) {
            ok = attention_head_backward(d, dy, dpb, NULL, &view, b, h, d[3].needed ? rows : NULL);
            for (int64_t i = 0; ok && d[3].needed && i < a.Tq; i++) dsink[h] += rows[i];
        }
    for (int h = 0; ok && d[3].needed && h < a.Hq; h++)
        ag_set(d[3].data, d[3].dtype, h, (float)dsink[h] + (d[3].fresh ? 0.0f : ag_get(d[3].data, d[3].dtype, h)));
    if (!ok) ag_fail(ctx, AG_ERR_NOMEM, "attention %s backward: out of memory", mp_site_name(n->site));
    free(rows);
    free(dsink);
    mp_free(&dp);
}

static const ag_op sinks_op = {
    .name = "attention_sinks", .backward = sinks_backward, .nsaved = AG_NSAVED(attention_sinks)};

ag_tensor *ag_attention_sinks(ag_ctx *ctx, const char *site, ag_tensor *q, ag_tensor *k, ag_tensor *v, int Hq, int Hkv,
                              int D, int64_t window, ag_tensor *sinks) {
    if (!sinks) return ag_attention_window(ctx, site, q, k, v, Hq, Hkv, D, window);
    ag_site s;
    ag_att_dims a;
    if (!ag_attention_begin(ctx, site, q, k, v, Hq, Hkv, D, window, &s, &a)) return NULL;
    const bool flash = ctx->attention != AG_ATTENTION_EAGER; // flash, or another SDPA kernel
    const bool lean =
        flash ? AG_FW(ctx->fw, flash) == AG_FLASH_FUSED : AG_FW(ctx->fw, attention) == AG_ATTENTION_OPS_FUSED;
    if (sinks->numel != Hq || !lean) {
        ag_fail(ctx, AG_ERR_ARG,
                "attention %s: sinks of %lld values for %d heads (one a head, under the lean framework: the only "
                "attention with sinks membill computes)",
                s.base, (long long)sinks->numel, Hq);
        return NULL;
    }
    ag_tensor *ins[] = {q, k, v, sinks};
    if (flash) return ag_attention_flash_checked(ctx, &s, q, k, v, sinks, &a, ag_any_needs_grad(ctx, 4, ins));
    ag_tensor *o, *probs;
    ag_node *n = eager_begin(ctx, &s, &a, &sinks_op, 4, ins, &o, &probs);
    if (!o) return NULL;
    if (!mp_is_meta()) {
        float sv[Hq];
        for (int h = 0; h < Hq; h++) sv[h] = ag_get(sinks->data, sinks->dtype, h);
        if (!attention_forward(ag_buf_of(o), ag_buf_of(probs), ag_buf_of(q), ag_buf_of(k), ag_buf_of(v), &a, sv))
            ag_fail(ctx, AG_ERR_NOMEM, "attention %s: out of memory for a conversion", s.base);
    }
    if (n) // backward reads every one of them (dP for the sinks' gradient needs v)
        n->state.attention_sinks = (ag_attention_sinks_state){
            .q = ag_retain(q), .k = ag_retain(k), .v = ag_retain(v), .probs = ag_retain(probs), .dims = a};
    ag_release(probs);
    return o;
}
