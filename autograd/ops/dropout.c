// dropout: y = x m / (1 - p), m[i] = 1 with probability 1 - p, from a seed (training mode).
//
// Under the PyTorch frameworks, native_dropout's memory (the fused kernel accelerators run): the
// output and a one-byte mask per element ("<prefix>:mask"), the mask kept for backward when x
// needs a gradient and freed at once otherwise. LEAN keeps no mask: backward draws the same one
// again from the seed (the draw is a pure function of the seed and the element's index).
#include <string.h>

#include "ag_ops.h"

// Whether element i is kept: a splitmix64 hash of (seed, i) against the drop probability.
static bool kept(uint64_t seed, int64_t i, float p) {
    uint64_t z = seed + 0x9e3779b97f4a7c15ULL * ((uint64_t)i + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return (float)(z >> 40) * 0x1p-24f >= p;
}

// y (+)= x m / (1 - p) over n elements of any dtype, a block at a time through float32; m is the
// kept mask when given, else drawn from the seed (and written to `mask_out` when that is given).
static void apply_mask(ag_buf y, bool fresh, ag_buf x, const uint8_t *m, uint8_t *mask_out, uint64_t seed, float p,
                       int64_t n) {
    const float k = 1.0f / (1.0f - p);
    float xb[AG_BLK], yb[AG_BLK];
    for (int64_t i = 0; i < n; i += AG_BLK) {
        int64_t len = n - i < AG_BLK ? n - i : AG_BLK;
        const float *xv = ag_rd(x, i, len, xb);
        float *yv = fresh ? ag_wr(y, i, yb) : ag_rw(y, i, len, yb);
        for (int64_t j = 0; j < len; j++) {
            bool keep = m ? m[i + j] : kept(seed, i + j, p);
            if (mask_out) mask_out[i + j] = keep;
            float v = keep ? k * xv[j] : 0.0f;
            yv[j] = fresh ? v : yv[j] + v;
        }
        ag_wr_end(y, i, len, yv);
    }
}

static void dropout_backward(ag_ctx *ctx, ag_node *n, const void *dy) {
    const ag_dropout_state *st = &n->state.dropout;
    ag_grad_dst d;
    if (!ag_grad_get(ctx, n, 0, &d) || !d.needed || mp_is_meta()) return;
    const uint8_t *m = st->mask ? (const uint8_t *)st->mask->data : NULL;
    apply_mask(ag_dst_buf(&d), d.fresh, (ag_buf){(void *)dy, n->grad_dtype}, m, NULL, st->seed, st->p, n->numel);
}

static const ag_op dropout_op = {.name = "dropout", .backward = dropout_backward, .nsaved = AG_NSAVED(dropout)};

ag_tensor *ag_dropout(ag_ctx *ctx, const char *site, ag_tensor *x, float p, uint64_t seed) {
    ag_tensor *ins[] = {x};
    if (!ag_check_inputs(ctx, "dropout", site, 1, ins, (const char *[]){"x"})) return NULL;
    ag_site s;
    ag_site_parse(&s, site);
    if (!(p >= 0.0f && p < 1.0f)) {
        ag_fail(ctx, AG_ERR_ARG, "dropout %s: p is %g, expected 0 <= p < 1", s.base, (double)p);
        return NULL;
    }
    char l[AG_LABEL_MAX];
    ag_label(l, s.base, "mask");
    ag_tensor *y = ag_tensor_like(ctx, x, MP_ACTIVATION, s.out);
    const bool keep_mask = AG_FW(ctx->fw, dropout_mask);
    ag_tensor *mask = y && keep_mask ? ag_tensor_new_bits(ctx, x->ndim, x->shape, MP_ACTIVATION, l, 8) : NULL;
    if (!y || (keep_mask && !mask)) {
        ag_release(y);
        return NULL;
    }
    if (!mp_is_meta())
        apply_mask(ag_buf_of(y), true, ag_buf_of(x), NULL, mask ? (uint8_t *)mask->data : NULL, seed, p, x->numel);
    ag_node *n = ag_any_needs_grad(ctx, 1, ins) ? ag_record(ctx, &dropout_op, s.base, y, 1, ins) : NULL;
    if (n)
        n->state.dropout = (ag_dropout_state){.mask = mask, .p = p, .seed = seed}; // takes the mask over
    else
        ag_release(mask);
    if (!n && ctx->status != AG_OK) ag_release(y), y = NULL;
    return y;
}
