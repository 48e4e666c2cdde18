// attention_mla: causal attention whose values have a head size of their own (DeepSeek-V3's
// multi-head latent attention: q and k [B, T, H*D], D = nope + rope, v [B, T, H*Dv]), eager, one
// fused op keeping q, k, v and the probabilities (the lean framework's saved set):
//   S = scale Q Kᵀ (masked), P = softmax(S) rows, O = P V, O [B, T, H*Dv]
// The scale is given (DeepSeek's D^-1/2 times yarn's mscale squared).
#include <string.h>

#include "ag_ops.h"

// Dims for the products on the value side: their width is Dv.
static ag_att_dims value_side(const ag_att_dims *a, int Dv) {
    ag_att_dims v = *a;
    v.D = Dv;
    return v;
}

// One head's rows of P: the causal softmax of its scores, in place.
static void softmax_rows(ag_buf p, const ag_att_dims *a) {
    const int64_t n = a->Tk;
    float buf[n];
    for (int64_t i = 0; i < a->Tq; i++) {
        const int64_t seen = ag_keys_seen(a, i);
        float *row = ag_rw(p, i * n, n, buf);
        float mx = row[0];
        for (int64_t j = 1; j < seen; j++) mx = row[j] > mx ? row[j] : mx;
        const float inv = (float)(1.0 / ag_softmax_exp(row, row, seen, mx, NULL));
        for (int64_t j = 0; j < seen; j++) row[j] *= inv;
        for (int64_t j = seen; j < n; j++) row[j] = 0.0f;
        ag_wr_end(p, i * n, n, row);
    }
}

static bool mla_forward(ag_buf o, ag_buf probs, ag_buf q, ag_buf k, ag_buf v, const ag_att_dims *a, int Dv) {
    const ag_att_dims av = value_side(a, Dv);
    const int64_t ld = (int64_t)a->Hq * a->D, ldv = (int64_t)a->Hq * Dv;
    bool ok = true;
    for (int64_t b = 0; b < a->B && ok; b++)
        for (int h = 0; h < a->Hq && ok; h++) {
            ag_buf p = ag_buf_at(probs, (b * a->Hq + h) * a->Tq * a->Tk);
            ok = ag_causal_scores(a, a->scale, ag_buf_at(q, b * a->Tq * ld + (int64_t)h * a->D), ld,
                                  ag_buf_at(k, b * a->Tk * ld + (int64_t)h * a->D), ld, p);
            if (ok) softmax_rows(p, a);
            ok = ok && ag_causal_rows(&av, 1.0f, p, ag_buf_at(v, b * a->Tk * ldv + (int64_t)h * Dv), ldv, 0.0f,
                                      ag_buf_at(o, b * a->Tq * ldv + (int64_t)h * Dv), ldv);
        }
    return ok;
}

// One (batch, head): dV = Pᵀ dO; dP = dO Vᵀ; dS; dQ = scale dS K; dK = scale dSᵀ Q.
static bool mla_head_backward(const ag_grad_dst *d, ag_buf dout, ag_buf dp, const ag_attention_mla_state *st, int64_t b,
                              int h) {
    const ag_att_dims *a = &st->dims, av = value_side(a, st->Dv);
    const int64_t ld = (int64_t)a->Hq * a->D, ldv = (int64_t)a->Hq * st->Dv;
    const int64_t qo = b * a->Tq * ld + (int64_t)h * a->D, ko = b * a->Tk * ld + (int64_t)h * a->D;
    const int64_t oo = b * a->Tq * ldv + (int64_t)h * st->Dv, vo = b * a->Tk * ldv + (int64_t)h * st->Dv;
    ag_buf p = ag_buf_at(ag_buf_of(st->probs), (b * a->Hq + h) * a->Tq * a->Tk), dO = ag_buf_at(dout, oo);
    bool ok = true;
    if (d[2].needed)
        ok = ag_causal_keys(&av, 1.0f, p, dO, ldv, d[2].fresh ? 0.0f : 1.0f, ag_buf_at(ag_dst_buf(&d[2]), vo), ldv);
    if (!d[0].needed && !d[1].needed) return ok;
    ok = ok && ag_causal_scores(&av, 1.0f, dO, ldv, ag_buf_at(ag_buf_of(st->v), vo), ldv, dp);
    const int64_t n = a->Tk;
    float db[n], pb[n];
    for (int64_t i = 0; ok && i < a->Tq; i++) {
        const int64_t seen = ag_keys_seen(a, i);
        float *row = ag_rw(dp, i * n, n, db);
        ag_softmax_backward_row(row, row, ag_rd(p, i * n, n, pb), seen);
        for (int64_t j = seen; j < n; j++) row[j] = 0.0f;
        ag_wr_end(dp, i * n, n, row);
    }
    if (d[0].needed)
        ok = ok && ag_causal_rows(a, a->scale, dp, ag_buf_at(ag_buf_of(st->k), ko), ld, d[0].fresh ? 0.0f : 1.0f,
                                  ag_buf_at(ag_dst_buf(&d[0]), qo), ld);
    if (d[1].needed)
        ok = ok && ag_causal_keys(a, a->scale, dp, ag_buf_at(ag_buf_of(st->q), qo), ld, d[1].fresh ? 0.0f : 1.0f,
                                  ag_buf_at(ag_dst_buf(&d[1]), ko), ld);
    return ok;
}

static void mla_backward(ag_ctx *ctx, ag_node *n, const void *dout) {
    const ag_attention_mla_state *st = &n->state.attention_mla;
    const ag_att_dims a = st->dims;
    ag_grad_dst d[3];
    if (!ag_grad_get_all(ctx, n, d)) return;
    mp_block dp = {0}; // dP of one head, reused across heads
    char label[AG_LABEL_MAX];
    ag_label(label, mp_site_name(n->site), "dprobs");
    if ((d[0].needed || d[1].needed) &&
        !ag_alloc_block(ctx, &dp, (size_t)(a.Tq * a.Tk) * sizeof(float), MP_ACTIVATION, label))
        return;
    bool ok = true;
    ag_buf dpb = {dp.data, n->grad_dtype}, dy = {(void *)dout, n->grad_dtype};
    if (!mp_is_meta())
        for (int64_t b = 0; b < a.B && ok; b++)
            for (int h = 0; h < a.Hq && ok; h++) ok = mla_head_backward(d, dy, dpb, st, b, h);
    if (!ok) ag_fail(ctx, AG_ERR_NOMEM, "attention_mla %s backward: out of memory", mp_site_name(n->site));
    mp_free(&dp);
}

static const ag_op mla_op = {.name = "attention_mla", .backward = mla_backward, .nsaved = AG_NSAVED(attention_mla)};

ag_tensor *ag_attention_mla(ag_ctx *ctx, const char *site, ag_tensor *q, ag_tensor *k, ag_tensor *v, int H, int D,
                            int Dv, float scale) {
    ag_tensor *ins[] = {q, k, v};
    if (!ag_check_inputs(ctx, "attention_mla", site, 3, ins, (const char *[]){"q", "k", "v"})) return NULL;
    ag_site s;
    ag_site_parse(&s, site);
    char sq[64], sk[64], sv[64];
    if (H < 1 || D < 1 || Dv < 1 || !(scale > 0.0f) || q->ndim != 3 || k->ndim != 3 || v->ndim != 3 ||
        q->shape[2] != (int64_t)H * D || k->shape[2] != (int64_t)H * D || v->shape[2] != (int64_t)H * Dv ||
        q->shape[0] != k->shape[0] || v->shape[0] != k->shape[0] || v->shape[1] != k->shape[1] ||
        k->shape[1] < q->shape[1]) {
        ag_fail(ctx, AG_ERR_SHAPE,
                "attention_mla %s: q %s, k %s, v %s do not fit %d heads of %d (q, k) and %d (v) at scale %g "
                "(expected q[B, Tq, %lld], k[B, Tk, %lld], v[B, Tk, %lld], Tk >= Tq, a positive scale)",
                s.base, ag_shape_str(q, sq), ag_shape_str(k, sk), ag_shape_str(v, sv), H, D, Dv, (double)scale,
                (long long)H * D, (long long)H * D, (long long)H * Dv);
        return NULL;
    }
    if (ctx->attention != AG_ATTENTION_EAGER || AG_FW(ctx->fw, attention) != AG_ATTENTION_OPS_FUSED) {
        ag_fail(ctx, AG_ERR_ARG,
                "attention_mla %s: a value head size of its own (%d, keys %d) runs as the lean framework's eager "
                "attention only (--attention eager --framework lean)",
                s.base, Dv, D);
        return NULL;
    }
    const ag_att_dims a = {q->shape[0], q->shape[1], k->shape[1], H, H, D, 0, scale, 0.0f};
    char label[AG_LABEL_MAX];
    ag_label(label, s.base, "probs");
    ag_tensor *o = ag_tensor_new_bits(ctx, 3, (int64_t[]){a.B, a.Tq, (int64_t)H * Dv}, MP_ACTIVATION, s.out, q->bits);
    ag_tensor *probs = o ? ag_tensor_new(ctx, 4, (int64_t[]){a.B, H, a.Tq, a.Tk}, MP_ACTIVATION, label) : NULL;
    ag_node *n = probs && ag_any_needs_grad(ctx, 3, ins) ? ag_record(ctx, &mla_op, s.base, o, 3, ins) : NULL;
    if (!probs || ctx->status != AG_OK) {
        ag_release(probs), ag_release(o);
        return NULL;
    }
    if (!mp_is_meta() && !mla_forward(ag_buf_of(o), ag_buf_of(probs), ag_buf_of(q), ag_buf_of(k), ag_buf_of(v), &a, Dv))
        ag_fail(ctx, AG_ERR_NOMEM, "attention_mla %s: out of memory for a conversion", s.base);
    if (n)
        n->state.attention_mla =
            (ag_attention_mla_state){.q = ag_retain(ag_wants_grad(n, 1) ? q : NULL),
                                     .k = ag_retain(ag_wants_grad(n, 0) ? k : NULL),
                                     .v = ag_retain(ag_wants_grad(n, 0) || ag_wants_grad(n, 1) ? v : NULL),
                                     .probs = ag_retain(probs),
                                     .dims = a,
                                     .Dv = Dv};
    ag_release(probs);
    return o;
}
