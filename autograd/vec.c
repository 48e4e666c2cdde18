// Elementwise loops shared by several ops, split over the pool.
#include "ag_internal.h"

typedef struct {
    float *dst;
    const float *a, *b;
    bool fresh;
} vec_args;

static void add_part(void *p, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const vec_args *v = p;
    for (int64_t i = lo; i < hi; i++) v->dst[i] = v->a[i] + v->b[i];
}

void ag_vec_add(float *dst, const float *a, const float *b, int64_t n) {
    ag_parallel_for(n, AG_PAR_GRAIN, add_part, &(vec_args){dst, a, b, false});
}

static void mul_part(void *p, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const vec_args *v = p;
    if (v->fresh)
        for (int64_t i = lo; i < hi; i++) v->dst[i] = v->a[i] * v->b[i];
    else
        for (int64_t i = lo; i < hi; i++) v->dst[i] += v->a[i] * v->b[i];
}

void ag_vec_mul_into(float *dst, bool fresh, const float *a, const float *b, int64_t n) {
    ag_parallel_for(n, AG_PAR_GRAIN, mul_part, &(vec_args){dst, a, b, fresh});
}
