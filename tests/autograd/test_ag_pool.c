// The compute pool: every item of a loop runs once, per-thread slots stay below the threads
// that can take part, nested and concurrent loops run, idle threads sleep instead of spinning,
// and a product split over the pool equals the one computed in one piece.
#include "ag_test_util.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/ag_kernels.h"

typedef struct {
    _Atomic int *hits;
    _Atomic int max_slot;
    _Atomic int nested_ok;
} visit;

static void count_part(void *p, int64_t lo, int64_t hi, int thread) {
    visit *v = p;
    for (int64_t i = lo; i < hi; i++) atomic_fetch_add(&v->hits[i], 1);
    int m = atomic_load(&v->max_slot);
    while (thread > m && !atomic_compare_exchange_weak(&v->max_slot, &m, thread)) {
    }
}

static void check_loop(int threads, int64_t n, int64_t grain, bool tasks) {
    ag_set_num_threads(threads);
    visit v = {.hits = calloc((size_t)n + 1, sizeof(_Atomic int)), .max_slot = -1};
    if (tasks)
        ag_parallel_tasks(n, count_part, &v);
    else
        ag_parallel_for(n, grain, count_part, &v);
    for (int64_t i = 0; i < n; i++) assert_int_equal(atomic_load(&v.hits[i]), 1);
    int bound = (int)(n < threads ? n : threads); // a loop has at most n chunks
    assert_true(atomic_load(&v.max_slot) < bound);
    free(v.hits);
}

static void test_every_item_once(void **state) {
    (void)state;
    const int64_t sizes[] = {1, 2, 3, 7, 64, 1000, 65537};
    for (int t = 1; t <= 8; t *= 2)
        for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
            check_loop(t, sizes[i], 1, false);
            check_loop(t, sizes[i], 100, false);
            check_loop(t, sizes[i], 1, true);
        }
    ag_set_num_threads(2);
}

// Several loops as one (ag_parallel_jobs): every item of every loop once, thread slots below the
// threads, loops of no item and of fewer than a grain.
static void test_jobs_every_item_once(void **state) {
    (void)state;
    const int64_t sizes[][3] = {{144, 48, 48}, {0, 5, 1000}, {65537, 1, 0}, {384, 384, 3}, {7, 7, 7}};
    const int64_t grains[] = {1, 15, 100};
    for (int t = 1; t <= 4; t++)
        for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
            for (size_t g = 0; g < sizeof grains / sizeof *grains; g++) {
                ag_set_num_threads(t);
                visit v[3];
                ag_job jobs[3];
                for (int j = 0; j < 3; j++) {
                    v[j] = (visit){.hits = calloc((size_t)sizes[s][j] + 1, sizeof(_Atomic int)), .max_slot = -1};
                    jobs[j] = (ag_job){count_part, &v[j], sizes[s][j], grains[g]};
                }
                ag_parallel_jobs(3, jobs);
                for (int j = 0; j < 3; j++) {
                    for (int64_t i = 0; i < sizes[s][j]; i++)
                        if (atomic_load(&v[j].hits[i]) != 1)
                            fail_msg("%d threads, loop %d of %lld items, grain %lld: item %lld ran %d times", t, j,
                                     (long long)sizes[s][j], (long long)grains[g], (long long)i,
                                     atomic_load(&v[j].hits[i]));
                    assert_true(atomic_load(&v[j].max_slot) < t);
                    free(v[j].hits);
                }
            }
    ag_set_num_threads(2);
}

static void nested_part(void *p, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    visit *v = p;
    for (int64_t i = lo; i < hi; i++) {
        visit inner = {.hits = calloc(10, sizeof(_Atomic int)), .max_slot = -1};
        ag_parallel_for(10, 1, count_part, &inner); // runs here, as thread 0
        bool ok = atomic_load(&inner.max_slot) == 0;
        for (int j = 0; j < 10; j++) ok = ok && atomic_load(&inner.hits[j]) == 1;
        if (!ok) atomic_store(&v->nested_ok, 0);
        free(inner.hits);
        atomic_fetch_add(&v->hits[i], 1);
    }
}

static void test_nested_loops(void **state) {
    (void)state;
    ag_set_num_threads(4);
    visit v = {.hits = calloc(64, sizeof(_Atomic int)), .nested_ok = 1};
    ag_parallel_tasks(64, nested_part, &v);
    assert_int_equal(atomic_load(&v.nested_ok), 1);
    for (int i = 0; i < 64; i++) assert_int_equal(atomic_load(&v.hits[i]), 1);
    free(v.hits);
    ag_set_num_threads(2);
}

// Thousands of short loops back to back, from two threads at once: no lost wake-up, no loop
// run twice or skipped (a hang would be caught by ctest's timeout).
static void *many_loops(void *p) {
    int64_t *bad = p;
    for (int r = 0; r < 3000; r++) {
        _Atomic int hits[33] = {0};
        visit v = {.hits = hits, .max_slot = -1};
        ag_parallel_for(33, 1, count_part, &v);
        for (int i = 0; i < 33; i++) *bad += atomic_load(&hits[i]) != 1;
    }
    return NULL;
}

static void test_concurrent_callers(void **state) {
    (void)state;
    ag_set_num_threads(3);
    pthread_t th;
    int64_t bad_a = 0, bad_b = 0;
    assert_int_equal(pthread_create(&th, NULL, many_loops, &bad_a), 0);
    many_loops(&bad_b);
    pthread_join(th, NULL);
    assert_int_equal(bad_a + bad_b, 0);
    ag_set_num_threads(2);
}

// Which thread ran each item, each item taking a few microseconds (so that both threads take
// part); the caller's items are marked.
typedef struct {
    pthread_t caller;
    int64_t spin_ns, worker_sleep_ns;
    _Atomic int *by; // slot + 1, or -(slot + 1) for the caller
} who;

static int64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void who_part(void *p, int64_t lo, int64_t hi, int thread) {
    who *w = p;
    bool caller = pthread_equal(pthread_self(), w->caller);
    for (int64_t i = lo; i < hi; i++) {
        if (!caller && w->worker_sleep_ns) {
            struct timespec ts = {0, w->worker_sleep_ns};
            nanosleep(&ts, NULL);
        }
        for (int64_t t0 = mono_ns(); mono_ns() - t0 < w->spin_ns;) {
        }
        atomic_store(&w->by[i], caller ? -(thread + 1) : thread + 1);
    }
}

// Each thread sweeps a few ranges in order, not chunks scattered over the loop: its own share,
// then halves of what others have left. A steal takes half of what is left, so there are about
// log2(chunks) of them, each adding at most two ranges; the bound leaves room for a busy machine
// (one counter for all chunks scatters them: up to 256 ranges).
static void test_shares_contiguous(void **state) {
    (void)state;
    ag_set_num_threads(2);
    enum { N = 256 };
    _Atomic int by[N];
    int worst = 0, both = 0;
    for (int r = 0; r < 20; r++) {
        for (int i = 0; i < N; i++) atomic_store(&by[i], 0);
        who w = {.caller = pthread_self(), .spin_ns = 2000, .by = by};
        ag_parallel_tasks(N, who_part, &w);
        int runs = 1, workers = 0;
        for (int i = 0; i < N; i++) {
            assert_int_not_equal(atomic_load(&by[i]), 0);
            workers += atomic_load(&by[i]) != atomic_load(&by[0]);
            if (i && atomic_load(&by[i]) != atomic_load(&by[i - 1])) runs++;
        }
        both += workers > 0;
        worst = runs > worst ? runs : worst;
    }
    print_message("ranges of a 256-task loop on 2 threads: at most %d (in %d loops both threads ran)\n", worst, both);
    assert_true(worst <= 4 * 8);
}

// A thread that stalls in its first chunk holds back that chunk only: the caller takes the rest of
// its share (16 tasks; the worker sleeps 20 ms in each it runs, the caller's take microseconds).
static void test_stalled_share_taken(void **state) {
    (void)state;
    ag_set_num_threads(2);
    enum { N = 16 };
    _Atomic int by[N];
    for (int i = 0; i < N; i++) atomic_store(&by[i], 0);
    who w = {.caller = pthread_self(), .spin_ns = 1000, .worker_sleep_ns = 20000000, .by = by};
    ag_parallel_tasks(N, who_part, &w);
    int worker = 0;
    for (int i = 0; i < N; i++) {
        assert_int_not_equal(atomic_load(&by[i]), 0);
        worker += atomic_load(&by[i]) > 0;
    }
    print_message("tasks the stalled worker ran: %d of %d\n", worker, N);
    assert_true(worker <= 3);
}

static double cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// After a loop the pool's threads spin for microseconds, then sleep: 100 ms of waiting costs
// the process almost no CPU time (a pool that kept spinning would take 100 ms a thread).
static void test_idle_threads_sleep(void **state) {
    (void)state;
    ag_set_num_threads(4);
    _Atomic int hits[64] = {0};
    visit v = {.hits = hits, .max_slot = -1};
    // OpenBLAS starts threads of its own when it loads (never given work here: every call is
    // single-threaded); they spin for up to about 0.1 s before they sleep. Past that, only the
    // pool's threads could spin.
    struct timespec settle = {0, 300 * 1000 * 1000};
    nanosleep(&settle, NULL);
    ag_parallel_tasks(64, count_part, &v);
    double c0 = cpu_seconds();
    struct timespec pause = {0, 100 * 1000 * 1000};
    nanosleep(&pause, NULL);
    double used = cpu_seconds() - c0;
    print_message("CPU time while idle for 100 ms with 4 threads: %.3f ms\n", 1e3 * used);
    assert_true(used < 0.01);
    ag_set_num_threads(2);
}

// A prefetch hint: an idle thread of the pool fetches its regions (the bytes left fall to zero),
// a new hint replaces the one before, with one thread there is none, memory freed after the
// hint is harmless, and loops around hints run every item once.
static void test_prefetch(void **state) {
    (void)state;
    ag_set_num_threads(2);
    enum { SMALL = 1 << 16, BIG = 64 << 20 };
    char *a = malloc(SMALL), *big = malloc(BIG);
    assert_non_null(a);
    assert_non_null(big);
    memset(a, 1, SMALL);
    memset(big, 2, BIG);
    bool drained = false; // the worker spins a while after a loop: a hint then is taken at once
    for (int attempt = 0; attempt < 200 && !drained; attempt++) {
        _Atomic int hits[64] = {0};
        visit v = {.hits = hits, .max_slot = -1};
        ag_parallel_tasks(64, count_part, &v);
        ag_pool_prefetch(1, (const void *[]){a}, (size_t[]){SMALL});
        struct timespec us = {0, 1000};
        for (int k = 0; k < 200 && ag_pool_prefetch_left() > 0; k++) nanosleep(&us, NULL);
        drained = ag_pool_prefetch_left() == 0;
    }
    assert_true(drained);
    ag_pool_prefetch(2, (const void *[]){big, NULL}, (size_t[]){BIG, 0});
    ag_pool_prefetch(1, (const void *[]){a}, (size_t[]){SMALL});
    assert_true(ag_pool_prefetch_left() <= SMALL); // the 64 MB are forgotten
    ag_pool_prefetch(1, (const void *[]){big}, (size_t[]){BIG});
    free(big); // fetched or not, freed: prefetches do not fault
    check_loop(2, 100000, 1000, false);
    ag_set_num_threads(1);
    ag_pool_prefetch(1, (const void *[]){a}, (size_t[]){SMALL});
    assert_int_equal(ag_pool_prefetch_left(), 0);
    ag_set_num_threads(2);
    free(a);
}

// The BLAS under ag_sgemm is called from several threads at once: each call must get its own
// buffers (Debian's single-threaded OpenBLAS shares them: here up to one product in a
// thousand came out wrong).
enum { RM = 64, RN = 130, RK = 257 };
static float ra[RM * RK], rb[RK * RN], rref[RM * RN];

static void *same_products(void *p) {
    int64_t *bad = p;
    float *c = malloc(sizeof rref);
    for (int r = 0; r < 3000; r++) {
        ag_sgemm(CblasNoTrans, CblasNoTrans, RM, RN, RK, 1.0f, ra, RK, rb, RN, 0.0f, c, RN);
        *bad += memcmp(c, rref, sizeof rref) != 0;
    }
    free(c);
    return NULL;
}

static void test_blas_from_threads(void **state) {
    (void)state;
    ag_set_num_threads(1); // each thread's products in one piece: the threads race in the BLAS
    for (int i = 0; i < RM * RK; i++) ra[i] = (float)(i % 7) * 0.1f;
    for (int i = 0; i < RK * RN; i++) rb[i] = (float)(i % 11) * 0.1f;
    ag_sgemm(CblasNoTrans, CblasNoTrans, RM, RN, RK, 1.0f, ra, RK, rb, RN, 0.0f, rref, RN);
    // More threads than cores: a thread preempted inside a call is when buffers get shared.
    pthread_t th[3];
    int64_t bad[4] = {0};
    for (int i = 0; i < 3; i++) assert_int_equal(pthread_create(&th[i], NULL, same_products, &bad[i]), 0);
    same_products(&bad[3]);
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    assert_int_equal(bad[0] + bad[1] + bad[2] + bad[3], 0);
    ag_set_num_threads(2);
}

static void test_split_sgemm(void **state) {
    (void)state;
    ag_check_sgemm_shapes();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_item_once),    cmocka_unit_test(test_nested_loops),
        cmocka_unit_test(test_concurrent_callers), cmocka_unit_test(test_idle_threads_sleep),
        cmocka_unit_test(test_split_sgemm),        cmocka_unit_test(test_blas_from_threads),
        cmocka_unit_test(test_prefetch),           cmocka_unit_test(test_jobs_every_item_once),
        cmocka_unit_test(test_shares_contiguous),  cmocka_unit_test(test_stalled_share_taken),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
