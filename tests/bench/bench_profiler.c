// The cost of billing: mp_alloc + mp_free against plain malloc + free, 64 B to 64 MB.
// Usage: bench_profiler [rounds]. Prints nanoseconds per pair and the ratio, measured in one run.
#include "profiler.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// Each round allocates a batch, touches one byte of each (so neither side can skip the work),
// and frees it; the best of the rounds is kept, the machine being shared.
#define BATCH 64

static double time_malloc(size_t size, int rounds) {
    void *p[BATCH];
    double best = 1e30;
    for (int r = 0; r < rounds; r++) {
        double t = now();
        for (int i = 0; i < BATCH; i++) {
            p[i] = malloc(size);
            ((volatile char *)p[i])[0] = 1;
        }
        for (int i = 0; i < BATCH; i++) free(p[i]);
        double e = (now() - t) / BATCH;
        if (e < best) best = e;
    }
    return best;
}

static double time_mp(size_t size, int rounds) {
    mp_block b[BATCH];
    double best = 1e30;
    for (int r = 0; r < rounds; r++) {
        double t = now();
        for (int i = 0; i < BATCH; i++) {
            if (mp_alloc(&b[i], size, MP_ACTIVATION, "bench") != MP_OK) return -1;
            ((volatile char *)b[i].data)[0] = 1;
        }
        for (int i = 0; i < BATCH; i++) mp_free(&b[i]);
        double e = (now() - t) / BATCH;
        if (e < best) best = e;
    }
    return best;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 50;
    if (rounds < 1) rounds = 1;
    mp_options o = {.track_other = false, .keep_timeline = false};
    if (mp_init(&o) != MP_OK) {
        fprintf(stderr, "bench_profiler: cannot start the profiler\n");
        return 1;
    }
    printf("backend %s, best of %d rounds of %d allocations\n", mp_backend(), rounds, BATCH);
    printf("%12s %16s %16s %8s\n", "size", "malloc+free ns", "mp_alloc+free ns", "ratio");
    for (size_t size = 64; size <= ((size_t)64 << 20); size *= 4) {
        double m = time_malloc(size, rounds), p = time_mp(size, rounds);
        printf("%12zu %16.1f %16.1f %8.2f\n", size, m * 1e9, p * 1e9, p / m);
    }
    mp_shutdown();
    return 0;
}
