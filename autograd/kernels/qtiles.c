// Products with a quantised weight, its rows dequantised a tile at a time (a fused kernel's way:
// no whole dequantised copy), accumulated in float32: a frozen QLoRA base's linear under LEAN
// semantics and the experts' grouped products over a quantised base.
#include <stdlib.h>

#include "ag_kernels.h"

enum { TILE = 64 }; // rows of w dequantised at a time

// Rows [r0, r0 + n) of w as float32 values of dtype t (rounded once to t): what a dequantisation
// into a tensor of dtype t holds.
static void rows_in(const ag_tensor *w, int64_t r0, int64_t n, ag_dtype t, float *dst) {
    const int64_t in = w->shape[1];
    const ag_type_traits *tr = ag_type_traits_of(t);
    for (int64_t r = 0; r < n; r++) {
        float *row = dst + r * in;
        ag_tensor_row_f32(w, r0 + r, row);
        if (t == AG_F32) continue;
        for (int64_t j0 = 0; j0 < in; j0 += AG_BLK) { // round to t and back, AG_BLK at a time
            uint16_t h[AG_BLK];
            int64_t k = in - j0 < AG_BLK ? in - j0 : AG_BLK;
            tr->from_f32(row + j0, h, k);
            tr->to_f32(h, row + j0, k);
        }
    }
}

// y[M, out] = x[M, in] · w[out, in]ᵀ, TILE rows of w at a time, accumulated in float32.
bool ag_qgemm_tiles(ag_buf y, ag_buf x, const ag_tensor *w, int64_t M) {
    const int64_t out = w->shape[0], in = w->shape[1];
    float *xf = x.t == AG_F32 ? x.p : malloc((size_t)(M * in) * sizeof(float));
    float *yf = y.t == AG_F32 ? y.p : malloc((size_t)(M * out) * sizeof(float));
    float *wt = malloc((size_t)(TILE * in) * sizeof(float));
    bool ok = xf && yf && wt;
    if (ok && xf != x.p) ag_type_traits_of(x.t)->to_f32(x.p, xf, M * in);
    for (int64_t n0 = 0; ok && n0 < out; n0 += TILE) {
        int64_t nt = out - n0 < TILE ? out - n0 : TILE;
        rows_in(w, n0, nt, y.t, wt);
        ag_sgemm(CblasNoTrans, CblasTrans, M, nt, in, 1.0f, xf, in, wt, in, 0.0f, yf + n0, out);
    }
    if (ok && yf != y.p) ag_type_traits_of(y.t)->from_f32(yf, y.p, M * out);
    if (xf != x.p) free(xf);
    if (yf != y.p) free(yf);
    free(wt);
    return ok;
}

// dx[M, in] (+)= dy[M, out] · w[out, in], TILE rows of w (a slice of the sum) at a time, in a
// float32 accumulator rounded once into dx.
bool ag_qgemm_tiles_dx(ag_buf dx, bool fresh, ag_buf dy, const ag_tensor *w, int64_t M) {
    const int64_t out = w->shape[0], in = w->shape[1];
    float *dyf = dy.t == AG_F32 ? dy.p : malloc((size_t)(M * out) * sizeof(float));
    float *acc = dx.t == AG_F32 ? dx.p : malloc((size_t)(M * in) * sizeof(float));
    float *wt = malloc((size_t)(TILE * in) * sizeof(float));
    bool ok = dyf && acc && wt;
    if (ok && dyf != dy.p) ag_type_traits_of(dy.t)->to_f32(dy.p, dyf, M * out);
    if (ok && acc != dx.p && !fresh) ag_type_traits_of(dx.t)->to_f32(dx.p, acc, M * in);
    for (int64_t n0 = 0; ok && n0 < out; n0 += TILE) {
        int64_t nt = out - n0 < TILE ? out - n0 : TILE;
        rows_in(w, n0, nt, dy.t, wt);
        ag_sgemm(CblasNoTrans, CblasNoTrans, M, in, nt, 1.0f, dyf + n0, out, wt, in, n0 == 0 && fresh ? 0.0f : 1.0f,
                 acc, in);
    }
    if (ok && acc != dx.p) ag_type_traits_of(dx.t)->from_f32(acc, dx.p, M * in);
    if (dyf != dy.p) free(dyf);
    if (acc != dx.p) free(acc);
    free(wt);
    return ok;
}
