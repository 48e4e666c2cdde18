// What the benchmarks share: a monotonic clock, a seeded uniform generator, and a tensor check
// that ends the benchmark with autograd's error.
#pragma once

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "autograd.h"

static inline double bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// xorshift64 in [0, 1): the same inputs every run.
static inline float bench_uniform(void) {
    static uint64_t rng = 88172645463325252ull;
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)(rng >> 40) / 16777216.0f;
}

static inline ag_tensor *bench_checked(const char *bench, ag_ctx *ctx, ag_tensor *t) {
    if (!t) {
        fprintf(stderr, "%s: %s\n", bench, ag_ctx_error(ctx));
        exit(1);
    }
    return t;
}
