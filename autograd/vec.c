// Elementwise loops shared by several ops, split over the pool, any dtype (computed in float32).
#include <string.h>

#include "ag_internal.h"

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
