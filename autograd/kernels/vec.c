// Elementwise loops shared by several ops, split over the pool, any dtype (computed in float32).
#include <math.h>
#include <string.h>

#include "ag_kernels.h"

typedef enum { VEC_ADD, VEC_MUL, VEC_COPY } vec_kind;

typedef struct {
    vec_kind kind;
    ag_buf dst, a, b; // b: NULL data for VEC_COPY
    bool fresh;       // write dst (true) or add into it; VEC_ADD always writes
} vec_args;

// One loop for every kind: each block of AG_BLK elements read into float32, combined, rounded once.
static void vec_part(void *p, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const vec_args *v = p;
    float ab[AG_BLK], bb[AG_BLK], ob[AG_BLK];
    for (int64_t i = lo; i < hi; i += AG_BLK) {
        int64_t n = hi - i < AG_BLK ? hi - i : AG_BLK;
        const float *a = ag_rd(v->a, i, n, ab), *b = v->b.p ? ag_rd(v->b, i, n, bb) : NULL;
        float *o = v->fresh ? ag_wr(v->dst, i, ob) : ag_rw(v->dst, i, n, ob);
        if (v->kind == VEC_ADD)
            for (int64_t j = 0; j < n; j++) o[j] = a[j] + b[j];
        else if (v->kind == VEC_MUL && v->fresh)
            for (int64_t j = 0; j < n; j++) o[j] = a[j] * b[j];
        else if (v->kind == VEC_MUL)
            for (int64_t j = 0; j < n; j++) o[j] += a[j] * b[j];
        else if (v->fresh)
            memcpy(o, a, (size_t)n * sizeof(float));
        else
            for (int64_t j = 0; j < n; j++) o[j] += a[j];
        ag_wr_end(v->dst, i, n, o);
    }
}

static void vec_run(vec_kind kind, ag_buf dst, bool fresh, ag_buf a, ag_buf b, int64_t n) {
    ag_parallel_for(n, AG_PAR_GRAIN, vec_part, &(vec_args){kind, dst, a, b, fresh});
}

void ag_vec_add(ag_buf dst, ag_buf a, ag_buf b, int64_t n) { vec_run(VEC_ADD, dst, true, a, b, n); }

void ag_vec_mul_into(ag_buf dst, bool fresh, ag_buf a, ag_buf b, int64_t n) { vec_run(VEC_MUL, dst, fresh, a, b, n); }

void ag_vec_copy(ag_buf dst, ag_buf src, int64_t n) {
    if (dst.t == src.t) {
        size_t bytes = (size_t)n * (size_t)ag_type_traits_of(dst.t)->bits / 8;
        if (dst.p != src.p) memcpy(dst.p, src.p, bytes);
        return;
    }
    vec_run(VEC_COPY, dst, true, src, (ag_buf){0}, n);
}

void ag_vec_acc(ag_buf dst, bool fresh, ag_buf src, int64_t n) {
    if (fresh)
        ag_vec_copy(dst, src, n);
    else
        vec_run(VEC_COPY, dst, false, src, (ag_buf){0}, n);
}

#if defined(__x86_64__)
// Per lane the first index of its largest value (strictly greater, so NaN never wins), then the
// largest over the lanes, the lowest index among equals: the scalar loop's answer.
AG_AVX512 static int64_t argmax_avx512(const float *x, int64_t n) {
    __m512 best = _mm512_set1_ps(-INFINITY);
    __m512i at = _mm512_setzero_si512(), idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i step = _mm512_set1_epi32(16);
    for (int64_t i = 0; i < n; i += 16, idx = _mm512_add_epi32(idx, step)) {
        __m512 v = _mm512_maskz_loadu_ps(ag_lanes16(n - i), x + i);
        __mmask16 gt = _mm512_mask_cmp_ps_mask(ag_lanes16(n - i), v, best, _CMP_GT_OQ);
        best = _mm512_mask_mov_ps(best, gt, v);
        at = _mm512_mask_mov_epi32(at, gt, idx);
    }
    float bv[16];
    int32_t bi[16];
    _mm512_storeu_ps(bv, best);
    _mm512_storeu_si512(bi, at);
    int k = 0;
    for (int l = 1; l < 16; l++)
        if (bv[l] > bv[k] || (bv[l] == bv[k] && bi[l] < bi[k])) k = l;
    return bi[k];
}
#endif

int64_t ag_argmax(const float *x, int64_t n) {
    if (n < 1 || x[0] != x[0]) return 0; // a NaN first: nothing is greater
#if defined(__x86_64__)
    if (n < ((int64_t)1 << 31) && ag_has_avx512()) return argmax_avx512(x, n);
#endif
    int64_t best = 0;
    for (int64_t j = 1; j < n; j++)
        if (x[j] > x[best]) best = j;
    return best;
}

void ag_rows_scale(ag_buf dst, bool fresh, ag_buf x, ag_buf s, int64_t rows, int64_t C) {
    float xb[C], ob[C];
    for (int64_t i = 0; i < rows; i++) {
        const float f = ag_get(s.p, s.t, i);
        const float *v = ag_rd(x, i * C, C, xb);
        float *o = fresh ? ag_wr(dst, i * C, ob) : ag_rw(dst, i * C, C, ob);
        for (int64_t j = 0; j < C; j++) o[j] = fresh ? v[j] * f : o[j] + v[j] * f;
        ag_wr_end(dst, i * C, C, o);
    }
}

float ag_row_dot(ag_buf x, ag_buf y, int64_t r, int64_t C) {
    float xb[C], yb[C], sum = 0.0f;
    const float *a = ag_rd(x, r * C, C, xb), *b = ag_rd(y, r * C, C, yb);
    for (int64_t j = 0; j < C; j++) sum += a[j] * b[j];
    return sum;
}

// db[out] (+)= the sum over the M rows of dy[M, out] (in float32): the bias needs nothing saved.
void ag_linear_bias_forward(ag_buf y, ag_buf b, int64_t M, int64_t out) {
    float bb[out], yb[out];
    const float *bv = ag_rd(b, 0, out, bb);
    for (int64_t r = 0; r < M; r++) {
        float *o = ag_rw(y, r * out, out, yb);
        for (int64_t j = 0; j < out; j++) o[j] += bv[j];
        ag_wr_end(y, r * out, out, o);
    }
}

void ag_linear_bias_backward(ag_buf db, bool fresh, ag_buf dy, int64_t M, int64_t out) {
    float acc[out], rb[out];
    if (fresh)
        memset(acc, 0, sizeof acc);
    else
        memcpy(acc, ag_rd(db, 0, out, rb), sizeof acc);
    for (int64_t r = 0; r < M; r++) {
        const float *g = ag_rd(dy, r * out, out, rb);
        for (int64_t j = 0; j < out; j++) acc[j] += g[j];
    }
    ag_vec_copy(db, ag_buf_f32(acc), out);
}
