// Elementwise loops shared by several ops, split over the pool, any dtype (computed in float32).
#include <string.h>

#include "ag_internal.h"

typedef struct {
    ag_buf dst, a, b;
    bool fresh;
} vec_args;

static void add_part(void *p, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const vec_args *v = p;
    float ab[AG_BLK], bb[AG_BLK], ob[AG_BLK];
    for (int64_t i = lo; i < hi; i += AG_BLK) {
        int64_t n = hi - i < AG_BLK ? hi - i : AG_BLK;
        const float *a = ag_rd(v->a, i, n, ab), *b = ag_rd(v->b, i, n, bb);
        float *o = ag_wr(v->dst, i, ob);
        for (int64_t j = 0; j < n; j++) o[j] = a[j] + b[j];
        ag_wr_end(v->dst, i, n, o);
    }
}

void ag_vec_add(ag_buf dst, ag_buf a, ag_buf b, int64_t n) {
    ag_parallel_for(n, AG_PAR_GRAIN, add_part, &(vec_args){dst, a, b, false});
}

static void mul_part(void *p, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const vec_args *v = p;
    float ab[AG_BLK], bb[AG_BLK], ob[AG_BLK];
    for (int64_t i = lo; i < hi; i += AG_BLK) {
        int64_t n = hi - i < AG_BLK ? hi - i : AG_BLK;
        const float *a = ag_rd(v->a, i, n, ab), *b = ag_rd(v->b, i, n, bb);
        float *o = v->fresh ? ag_wr(v->dst, i, ob) : ag_rw(v->dst, i, n, ob);
        if (v->fresh)
            for (int64_t j = 0; j < n; j++) o[j] = a[j] * b[j];
        else
            for (int64_t j = 0; j < n; j++) o[j] += a[j] * b[j];
        ag_wr_end(v->dst, i, n, o);
    }
}

void ag_vec_mul_into(ag_buf dst, bool fresh, ag_buf a, ag_buf b, int64_t n) {
    ag_parallel_for(n, AG_PAR_GRAIN, mul_part, &(vec_args){dst, a, b, fresh});
}

static void copy_part(void *p, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const vec_args *v = p;
    float ab[AG_BLK], ob[AG_BLK];
    for (int64_t i = lo; i < hi; i += AG_BLK) {
        int64_t n = hi - i < AG_BLK ? hi - i : AG_BLK;
        const float *a = ag_rd(v->a, i, n, ab);
        float *o = v->fresh ? ag_wr(v->dst, i, ob) : ag_rw(v->dst, i, n, ob);
        if (v->fresh)
            memcpy(o, a, (size_t)n * sizeof(float));
        else
            for (int64_t j = 0; j < n; j++) o[j] += a[j];
        ag_wr_end(v->dst, i, n, o);
    }
}

void ag_vec_copy(ag_buf dst, ag_buf src, int64_t n) {
    if (dst.t == src.t) {
        size_t bytes = (size_t)n * (size_t)ag_type_traits_of(dst.t)->bits / 8;
        if (dst.p != src.p) memcpy(dst.p, src.p, bytes);
        return;
    }
    ag_parallel_for(n, AG_PAR_GRAIN, copy_part, &(vec_args){dst, src, {0}, true});
}

void ag_vec_acc(ag_buf dst, bool fresh, ag_buf src, int64_t n) {
    if (fresh)
        ag_vec_copy(dst, src, n);
    else
        ag_parallel_for(n, AG_PAR_GRAIN, copy_part, &(vec_args){dst, src, {0}, false});
}
