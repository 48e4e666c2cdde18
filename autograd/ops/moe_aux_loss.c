// moe_aux_loss: Switch Transformer's load-balancing loss as transformers' load_balancing_loss_func
// computes it without an attention mask, over the routers' logits of every sparse layer:
//   p = softmax(cat(logits)) [R, E]; f_e = the share of the R k top-k choices that went to e;
//   loss = E Σ_e f_e mean_r p[r, e].
// Only p carries a gradient (the choices are counts): d loss / d p[r, e] = E f_e / R, then the
// softmax backward of each row, back to each layer's logits. The node keeps p (float32).
// Under the PyTorch frameworks the forward also makes the concatenation, the top-k, the one_hot
// [R, k, E] int64 and its float copy, as transformers does.
#include <stdlib.h>
#include <string.h>

#include "ag_ops.h"
#include "kernels/ag_moe.h"

static void aux_backward(ag_ctx *ctx, ag_node *n, const void *dout) {
    const ag_moe_aux_loss_state *st = &n->state.moe_aux_loss;
    const int E = st->E;
    const int64_t per = st->rows / st->layers;
    float dy = mp_is_meta() ? 0.0f : ag_get(dout, n->grad_dtype, 0), dp[E], ob[E];
    for (int l = 0; l < st->layers; l++) {
        ag_grad_dst d;
        if (!ag_grad_get(ctx, n, l, &d) || !d.needed || mp_is_meta()) continue;
        ag_buf g = ag_dst_buf(&d);
        for (int64_t r = 0; r < per; r++) {
            const float *p = ag_f32(st->probs) + (l * per + r) * E;
            for (int e = 0; e < E; e++) dp[e] = dy * st->scale * st->frac[e];
            ag_softmax_backward_row(dp, dp, p, E);
            float *o = d.fresh ? ag_wr(g, r * E, ob) : ag_rw(g, r * E, E, ob);
            for (int e = 0; e < E; e++) o[e] = d.fresh ? dp[e] : o[e] + dp[e];
            ag_wr_end(g, r * E, E, o);
        }
    }
}

static void aux_release(ag_op_state *s) { free(s->moe_aux_loss.frac); }

static const ag_op aux_op = {
    .name = "moe_aux_loss", .backward = aux_backward, .nsaved = AG_NSAVED(moe_aux_loss), .release = aux_release};

// p, the choices' shares and the loss (a real run).
static float compute(ag_tensor *const *logits, int L, int64_t per, int E, int k, float *p, float *frac) {
    int32_t sel[k];
    double loss = 0.0, *mean = calloc((size_t)E, sizeof *mean);
    if (!mean) return 0.0f;
    memset(frac, 0, (size_t)E * sizeof *frac);
    for (int l = 0; l < L; l++)
        for (int64_t r = 0; r < per; r++) {
            float zb[E], *pr = p + (l * per + r) * E;
            ag_moe_softmax_row(ag_rd(ag_buf_of(logits[l]), r * E, E, zb), E, pr);
            for (int e = 0; e < E; e++) mean[e] += pr[e];
            ag_moe_topk(pr, E, k, sel);
            for (int j = 0; j < k; j++) frac[sel[j]] += 1.0f;
        }
    const double R = (double)(L * per);
    for (int e = 0; e < E; e++) frac[e] = (float)(frac[e] / R), loss += frac[e] * (mean[e] / R);
    free(mean);
    return (float)(loss * E);
}

// transformers' transients: the concatenation, topk's values and indices, one_hot and its float
// copy (and the [k, E] mean MulBackward keeps, billed as the concatenation's share).
static void pytorch_bills(ag_ctx *ctx, const char *base, int64_t R, int E, int k, int bits) {
    mp_block cat = {0}, vals = {0}, idx = {0}, oh = {0}, ohf = {0};
    ag_moe_temp(ctx, &cat, base, "cat", R * E * bits / 8);
    ag_moe_temp(ctx, &vals, base, "topk_values", R * k * 4);
    ag_moe_temp(ctx, &idx, base, "topk_indices", R * k * 8);
    ag_moe_temp(ctx, &oh, base, "one_hot", R * k * E * 8);
    ag_moe_temp(ctx, &ohf, base, "one_hot_float", R * k * E * 4);
    mp_free(&ohf), mp_free(&oh), mp_free(&idx), mp_free(&vals), mp_free(&cat);
}

ag_tensor *ag_moe_aux_loss(ag_ctx *ctx, const char *site, int layers, ag_tensor *const *logits, int top_k) {
    if (!ctx || ctx->status != AG_OK) return NULL;
    ag_site s;
    ag_site_parse(&s, site);
    if (layers < 1 || !logits || !logits[0]) {
        ag_fail(ctx, AG_ERR_ARG, "moe_aux_loss %s: %d layers of logits", s.base, layers);
        return NULL;
    }
    const int E = (int)logits[0]->shape[logits[0]->ndim - 1];
    const int64_t per = logits[0]->numel / E;
    for (int l = 0; l < layers; l++)
        if (!logits[l] || logits[l]->numel != per * E) {
            ag_fail(ctx, AG_ERR_SHAPE, "moe_aux_loss %s: layer %d's logits differ from layer 0's [%lld, %d]", s.base, l,
                    (long long)per, E);
            return NULL;
        }
    if (top_k < 1 || top_k > E) {
        ag_fail(ctx, AG_ERR_ARG, "moe_aux_loss %s: top-k %d of %d experts", s.base, top_k, E);
        return NULL;
    }
    const int64_t R = per * layers;
    char l[AG_LABEL_MAX];
    ag_label(l, s.base, "probs");
    ag_tensor *p = ag_tensor_new_f32(ctx, 2, (int64_t[]){R, E}, MP_ACTIVATION, l);
    if (p && AG_FW(ctx->fw, moe) == AG_MOE_HF_EAGER) pytorch_bills(ctx, s.base, R, E, top_k, logits[0]->bits);
    ag_tensor *loss = p ? ag_tensor_new_f32(ctx, 1, (int64_t[]){1}, MP_ACTIVATION, s.out) : NULL;
    float *frac = loss ? malloc((size_t)E * sizeof *frac) : NULL;
    if (!loss || !frac) {
        if (loss) ag_fail(ctx, AG_ERR_NOMEM, "moe_aux_loss %s: out of memory", s.base);
        ag_release(p), ag_release(loss), free(frac);
        return NULL;
    }
    if (!mp_is_meta()) *ag_f32(loss) = compute(logits, layers, per, E, top_k, ag_f32(p), frac);
    ag_node *n = ag_any_needs_grad(ctx, layers, logits) ? ag_record(ctx, &aux_op, s.base, loss, layers, logits) : NULL;
    if (!n) {
        ag_release(p), free(frac);
        if (ctx->status != AG_OK) ag_release(loss), loss = NULL;
        return loss;
    }
    n->state.moe_aux_loss = (ag_moe_aux_loss_state){.probs = p,
                                                    .rows = R,
                                                    .E = E,
                                                    .k = top_k,
                                                    .layers = layers,
                                                    .frac = mp_is_meta() ? (free(frac), NULL) : frac,
                                                    .scale = (float)E / (float)R};
    return loss;
}
