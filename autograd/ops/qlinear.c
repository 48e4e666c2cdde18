// A linear over a frozen quantised weight (QLoRA's base): the weight dequantised in the compute
// dtype, for y = x · wᵀ in forward and dx = dy · w in backward; no gradient of its own.
#include <stdlib.h>
#include <string.h>

#include "ag_ops.h"

typedef struct {
    const ag_tensor *w;
    ag_buf dst; // [out, in] of the compute dtype
} dequant_args;

static void dequant_part(void *p, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const dequant_args *a = p;
    const int64_t in = a->w->shape[1];
    float row[in];
    for (int64_t r = lo; r < hi; r++) {
        ag_tensor_row_f32(a->w, r, row);
        ag_vec_copy(ag_buf_at(a->dst, r * in), ag_buf_f32(row), in);
    }
}

// bitsandbytes' dequantize_4bit(W).to(dtype): the whole weight as one temporary of dtype t. In
// meta mode the block is billed and left empty.
static bool dequantized_whole(ag_ctx *ctx, const char *base, const ag_tensor *w, ag_dtype t, mp_block *blk) {
    char l[AG_LABEL_MAX];
    ag_label(l, base, "dequantized");
    const size_t bytes = (size_t)w->numel * (t == AG_F32 ? 4 : 2);
    if (!ag_alloc_exact(ctx, blk, bytes, MP_TEMPORARY, l)) return false;
    if (blk->data) {
        int64_t in = w->shape[1];
        ag_parallel_for(w->shape[0], in > AG_PAR_GRAIN ? 1 : AG_PAR_GRAIN / in + 1, dequant_part,
                        &(dequant_args){w, (ag_buf){blk->data, t}});
    }
    return true;
}

bool ag_qlinear_forward(ag_ctx *ctx, const char *base, ag_tensor *y, const ag_tensor *x, const ag_tensor *w,
                        const ag_tensor *b) {
    const int64_t out = w->shape[0], in = w->shape[1], M = x->numel / in;
    ag_buf yb = ag_buf_of(y), xb = ag_buf_of(x);
    bool ok = true;
    if (AG_FW(ctx->fw, dequantize_whole)) {
        mp_block deq = {0};
        if (!dequantized_whole(ctx, base, w, yb.t, &deq)) return false;
        if (deq.data)
            ok = ag_gemm_buf(CblasNoTrans, CblasTrans, M, out, in, 1.0f, xb, in, (ag_buf){deq.data, yb.t}, in, 0.0f, yb,
                             out);
        mp_free(&deq);
    } else if (!mp_is_meta()) {
        ok = ag_qgemm_tiles(yb, xb, w, M);
    }
    if (ok && b && !mp_is_meta()) { // y[r, :] += b, rounded once
        float bb[out], row[out];
        const float *bv = ag_rd(ag_buf_of(b), 0, out, bb);
        for (int64_t r = 0; r < M; r++) {
            float *o = ag_rw(yb, r * out, out, row);
            for (int64_t j = 0; j < out; j++) o[j] += bv[j];
            ag_wr_end(yb, r * out, out, o);
        }
    }
    return ok || ag_fail(ctx, AG_ERR_NOMEM, "linear %s: out of memory dequantising %s", base, ag_tensor_name(w));
}

void ag_qlinear_backward(ag_ctx *ctx, ag_node *n, ag_buf dy) {
    const ag_linear_state *st = &n->state.linear;
    const char *base = mp_site_name(n->site);
    if (ag_wants_grad(n, 1)) {
        ag_fail(ctx, AG_ERR_ARG, "linear %s: %s is %s, which gets no gradient (freeze it: a quantised base)", base,
                ag_tensor_name(st->w), ag_type_traits_of(st->w->dtype)->name);
        return;
    }
    ag_grad_dst d[3];
    if (!ag_grad_get_all(ctx, n, d)) return;
    const int64_t M = st->rows, out = st->out, in = st->in;
    if (st->bias && d[2].needed && !mp_is_meta()) ag_linear_bias_backward(ag_dst_buf(&d[2]), d[2].fresh, dy, M, out);
    if (!d[0].needed) return;
    bool ok = true;
    if (AG_FW(ctx->fw, dequantize_whole)) { // grad_A = dy · dequantize_4bit(W).to(dy.dtype)
        mp_block deq = {0};
        if (!dequantized_whole(ctx, base, st->w, dy.t, &deq)) return;
        if (deq.data)
            ok = ag_gemm_buf(CblasNoTrans, CblasNoTrans, M, in, out, 1.0f, dy, out, (ag_buf){deq.data, dy.t}, in,
                             d[0].fresh ? 0.0f : 1.0f, ag_dst_buf(&d[0]), in);
        mp_free(&deq);
    } else if (!mp_is_meta()) {
        ok = ag_qgemm_tiles_dx(ag_dst_buf(&d[0]), d[0].fresh, dy, st->w, M);
    }
    if (!ok)
        ag_fail(ctx, AG_ERR_NOMEM, "linear %s backward: out of memory dequantising %s", base, ag_tensor_name(st->w));
}
