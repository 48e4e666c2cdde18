// One pool of compute threads for every parallel loop and every large sgemm (OpenBLAS runs
// single-threaded inside it), so that two pools never spin against each other.
//
// Work is handed out in chunks claimed one at a time, so a thread that loses its core to
// another process does less of the loop instead of holding the others back. Each thread first
// claims the chunks of its own contiguous share in order, and one that runs out takes the upper
// half of what another has left: a thread sweeps few ranges, each in order, so a weight stream
// restarts (and waits for memory) a few times a loop, not once a chunk. An idle thread
// spins a while (a loop that follows another soon finds it awake: a decode step is hundreds of
// short loops), then sleeps on a futex; once a spinning thread finds it lost its core, every
// spin is cut to a few microseconds for a while, so nothing spins while a core is wanted
// elsewhere. The caller works too and waits only for chunks that are in progress, never for a
// thread that has not woken yet.
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "ag_kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

#define POOL_MAX 256
#define SPIN_NS 100000         // how long an idle thread or a waiting caller spins before sleeping
#define SPIN_BUSY_NS 5000      // the same on a busy machine
#define PREEMPTED_NS 20000     // wall time beyond the thread's CPU time: it lost its core
#define CONTENDED_NS 100000000 // two losses this close: busy, for this long after the second

typedef struct {
    ag_range_fn fn;
    void *arg;
    int64_t n, chunk;
} pool_job;

static struct {
    _Atomic int threads; // including the caller
    int started;         // worker threads running
    pthread_t th[POOL_MAX];
    pthread_mutex_t lock; // serialises callers from different threads and resizing
    pool_job job;
    _Atomic uint32_t nchunks;                 // of the current job
    _Atomic uint32_t gen;                     // futex word: bumped for every job
    _Atomic int nshares;                      // shares of the current job, one a thread
    _Atomic uint64_t share[POOL_MAX];         // (see share_word): a chunk is claimed for its job only
    _Atomic uint32_t done;                    // futex word: chunks finished in the current job
    _Atomic int slots;                        // threads that have claimed a chunk of the current job
    _Atomic int sleepers;                     // workers asleep on gen
    _Atomic int caller_waiting;               // the caller asleep on done
} pool = {.lock = PTHREAD_MUTEX_INITIALIZER}; // threads 0: not set yet

static _Thread_local bool in_chunk; // this thread is running a chunk

// Memory an idle worker brings toward the caches (ag_pool_prefetch): up to PF_SLOTS regions in
// order, each one word, line index << 20 | slices of PF_SLICE bytes left, claimed a slice at a
// time. Prefetches never fault, so a region freed or replaced meanwhile costs a few useless
// reads, no more.
#define PF_SLOTS AG_PREFETCH_MAX
#define PF_SLICE 1024
#define PF_LEFT_BITS 20
#define PF_LEFT(w) ((w) & (((uint64_t)1 << PF_LEFT_BITS) - 1))
static _Atomic uint64_t pf_ring[PF_SLOTS];

void ag_pool_prefetch(int n, const void *const *p, const size_t *bytes) {
    if (atomic_load_explicit(&pool.threads, memory_order_relaxed) < 2) n = 0; // no idle thread to do it
    int k = 0;
    for (int i = 0; i < n && k < PF_SLOTS; i++) {
        if (!p[i] || !bytes[i]) continue;
        uint64_t line = (uint64_t)(uintptr_t)p[i] >> 6, slices = (bytes[i] + PF_SLICE - 1) / PF_SLICE;
        atomic_store_explicit(&pf_ring[k++], line << PF_LEFT_BITS | (slices < PF_LEFT(~0ull) ? slices : PF_LEFT(~0ull)),
                              memory_order_release);
    }
    for (; k < PF_SLOTS; k++) atomic_store_explicit(&pf_ring[k], 0, memory_order_relaxed);
}

size_t ag_pool_prefetch_left(void) {
    uint64_t slices = 0;
    for (int k = 0; k < PF_SLOTS; k++) slices += PF_LEFT(atomic_load(&pf_ring[k]));
    return (size_t)(slices * PF_SLICE);
}

// One slice of the first region with some left; false when none is left.
static bool prefetch_slice(void) {
    for (int k = 0; k < PF_SLOTS; k++) {
        _Atomic uint64_t *slot = &pf_ring[k];
        uint64_t w = atomic_load_explicit(slot, memory_order_acquire);
        while (PF_LEFT(w)) {
            uint64_t next = w - 1 + ((uint64_t)(PF_SLICE / 64) << PF_LEFT_BITS);
            if (!atomic_compare_exchange_weak_explicit(slot, &w, next, memory_order_acq_rel, memory_order_acquire))
                continue;
            const char *a = (const char *)(uintptr_t)((w >> PF_LEFT_BITS) << 6);
            for (int off = 0; off < PF_SLICE; off += 64) __builtin_prefetch(a + off, 0, 2); // into L2
            return true;
        }
    }
    return false;
}

static void futex_wait(_Atomic uint32_t *w, uint32_t seen) {
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *w) {
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t thread_cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

// When a spinning thread last found that it had lost its core to another thread or process, and
// until when the machine counts as busy: from the second loss within CONTENDED_NS (a virtual
// machine's host takes a core now and then for a moment; another process on the machine takes it
// again and again).
static _Atomic int64_t lost_core_at = INT64_MIN / 2, busy_until = INT64_MIN / 2;

// Spins until *w differs from seen; true when it changed, false when the spin ran out. It runs
// out after SPIN_NS, or at once when this thread lost its core while spinning (the wall clock
// ran ahead of its own CPU clock); on a busy machine every spin stops at SPIN_BUSY_NS.
// The clocks are first read after 64 pauses: most waits end sooner (the caller waiting for the
// last chunk of a short loop), and the CPU clock is a system call.
// A worker (prefetch) also fetches the pool's prefetch hint while it spins, unless the machine
// is busy: then the core may be wanted elsewhere, and a hint is not worth keeping it.
static bool spin_until_changed(_Atomic uint32_t *w, uint32_t seen, bool prefetch) {
    int64_t t0 = 0, c0 = 0, limit = 0;
    prefetch = prefetch && now_ns() >= atomic_load_explicit(&busy_until, memory_order_relaxed);
    for (int i = 1;; i++) {
        if (atomic_load_explicit(w, memory_order_acquire) != seen) return true;
        if (prefetch && prefetch_slice()) {
            i = 0; // a spin starts after the last slice
            continue;
        }
        cpu_relax();
        if (i % 64) continue;
        if (i == 64) {
            t0 = now_ns(), c0 = thread_cpu_ns();
            limit = t0 < atomic_load_explicit(&busy_until, memory_order_relaxed) ? SPIN_BUSY_NS : SPIN_NS;
            continue;
        }
        int64_t t = now_ns() - t0;
        if (t > limit) return false;
        if (i % 512 == 0 && t - (thread_cpu_ns() - c0) > PREEMPTED_NS) {
            int64_t at = t0 + t, last = atomic_exchange_explicit(&lost_core_at, at, memory_order_relaxed);
            if (at - last < CONTENDED_NS) atomic_store_explicit(&busy_until, at + CONTENDED_NS, memory_order_relaxed);
            return false;
        }
    }
}

// A share of a job's chunks, [next, end), in one word with the job's generation (its low 20
// bits): a thread still looking at an earlier job cannot claim from it. At most SHARE_CHUNKS
// chunks a job.
#define SHARE_BITS 22
#define SHARE_CHUNKS ((int64_t)1 << SHARE_BITS)
#define SHARE_MASK (((uint64_t)1 << SHARE_BITS) - 1)
static inline uint64_t share_word(uint32_t gen, uint64_t next, uint64_t end) {
    return (uint64_t)(gen & 0xFFFFF) << (2 * SHARE_BITS) | next << SHARE_BITS | end;
}
static inline bool share_of(uint64_t w, uint32_t gen) { return (uint32_t)(w >> (2 * SHARE_BITS)) == (gen & 0xFFFFF); }
static inline uint32_t share_next(uint64_t w) { return (uint32_t)(w >> SHARE_BITS & SHARE_MASK); }
static inline uint32_t share_end(uint64_t w) { return (uint32_t)(w & SHARE_MASK); }

// The next chunk of job gen for thread `own` (its share's first, else the upper half of another
// share's rest, which becomes its share); -1 when none is left or the job is no longer gen.
static int64_t claim_chunk(uint32_t gen, int own) {
    _Atomic uint64_t *mine = &pool.share[own];
    for (;;) {
        uint64_t w = atomic_load(mine);
        if (!share_of(w, gen)) return -1;
        if (share_next(w) >= share_end(w)) break;
        if (atomic_compare_exchange_weak(mine, &w, w + ((uint64_t)1 << SHARE_BITS))) return share_next(w);
    }
    int n = atomic_load(&pool.nshares);
    for (int i = 1; i < n; i++) {
        _Atomic uint64_t *other = &pool.share[(own + i) % n];
        uint64_t w = atomic_load(other);
        while (share_of(w, gen) && share_next(w) < share_end(w)) {
            uint32_t next = share_next(w), end = share_end(w), mid = next + (end - next) / 2;
            if (end - next == 1) { // the last one: take it as its owner would
                if (atomic_compare_exchange_weak(other, &w, w + ((uint64_t)1 << SHARE_BITS))) return next;
                continue;
            }
            if (!atomic_compare_exchange_weak(other, &w, share_word(gen, next, mid))) continue;
            // Own share is empty, so nobody else writes it: [mid + 1, end) after the chunk taken now.
            atomic_store(mine, share_word(gen, mid + 1, end));
            return mid;
        }
        if (!share_of(w, gen)) return -1;
    }
    return -1;
}

// Claims and runs chunks of job gen until none is left. A thread's first claim gives it the
// job's next slot, the index fn gets: slots are dense, below min(chunks, threads). own: the
// thread's share (the caller 0, worker i share i).
static void run_chunks(uint32_t gen, int own) {
    for (int slot = -1;;) {
        int64_t c = claim_chunk(gen, own);
        if (c < 0) return;
        // The job cannot change while one of its chunks is claimed and not done.
        const pool_job *j = &pool.job;
        if (slot < 0) slot = atomic_fetch_add(&pool.slots, 1);
        int64_t b = c * j->chunk, e = b + j->chunk < j->n ? b + j->chunk : j->n;
        in_chunk = true;
        j->fn(j->arg, b, e, slot);
        in_chunk = false;
        if (atomic_fetch_add(&pool.done, 1) + 1 == atomic_load(&pool.nchunks) && atomic_load(&pool.caller_waiting))
            futex_wake(&pool.done);
    }
}

static void *worker(void *p) {
    int id = (int)(intptr_t)p;
    uint32_t seen = atomic_load(&pool.gen);
    for (;;) {
        if (!spin_until_changed(&pool.gen, seen, true)) {
            atomic_fetch_add(&pool.sleepers, 1);
            while (atomic_load(&pool.gen) == seen) futex_wait(&pool.gen, seen);
            atomic_fetch_sub(&pool.sleepers, 1);
        }
        seen = atomic_load(&pool.gen);
        if (id >= pool.threads) continue; // parked by a smaller thread count
        run_chunks(seen, id);
    }
    return NULL;
}

// Chunks still running on other threads: spin a little, then sleep until the last one ends.
static void wait_done(uint32_t nchunks) {
    uint32_t d;
    while ((d = atomic_load(&pool.done)) != nchunks) {
        if (spin_until_changed(&pool.done, d, false)) continue;
        atomic_store(&pool.caller_waiting, 1);
        if (atomic_load(&pool.done) == d) futex_wait(&pool.done, d);
        atomic_store(&pool.caller_waiting, 0);
    }
}

// Runs fn over [0, n) in chunks of chunk items on the pool.
static void run_pool(int64_t n, int64_t chunk, ag_range_fn fn, void *arg) {
    if ((n + chunk - 1) / chunk > SHARE_CHUNKS) chunk = (n + SHARE_CHUNKS - 1) / SHARE_CHUNKS;
    uint32_t nchunks = (uint32_t)((n + chunk - 1) / chunk), gen = atomic_load(&pool.gen) + 1;
    int shares = atomic_load(&pool.threads);
    // The shares first: a thread still looking at the last job can no longer claim (that job's
    // shares are all empty, so it cannot claim from them either).
    for (int i = 0; i < shares; i++)
        atomic_store(&pool.share[i],
                     share_word(gen, (uint64_t)nchunks * i / shares, (uint64_t)nchunks * (i + 1) / shares));
    atomic_store(&pool.nshares, shares);
    pool.job = (pool_job){fn, arg, n, chunk};
    atomic_store(&pool.nchunks, nchunks);
    atomic_store(&pool.done, 0);
    atomic_store(&pool.slots, 0);
    atomic_store(&pool.gen, gen);
    if (atomic_load(&pool.sleepers) > 0) futex_wake(&pool.gen);
    run_chunks(gen, 0);
    wait_done(nchunks);
}

// Inside a chunk (a nested loop), with one thread, for a loop of one chunk, or while another
// thread uses the pool: the calling thread runs the whole range as thread 0.
static void run(int64_t n, int64_t chunk, ag_range_fn fn, void *arg) {
    if (n <= 0) return;
    if (in_chunk || ag_num_threads() == 1 || n <= chunk || pthread_mutex_trylock(&pool.lock) != 0) {
        fn(arg, 0, n, 0);
        return;
    }
    run_pool(n, chunk, fn, arg);
    pthread_mutex_unlock(&pool.lock);
}

void ag_parallel_for(int64_t n, int64_t grain, ag_range_fn fn, void *arg) {
    // About four chunks a thread: fine enough to rebalance when a core is lost.
    int64_t nt = ag_num_threads(), chunk = (n + 4 * nt - 1) / (4 * nt);
    if (n < 2 * grain) chunk = n; // not worth splitting
    run(n, chunk < grain ? grain : chunk, fn, arg);
}

void ag_parallel_tasks(int64_t n, ag_range_fn fn, void *arg) { run(n, 1, fn, arg); }

// Several loops as one: each split as ag_parallel_for splits it, the chunks of all of them
// claimed as one loop's (a decode step's weight streams end a loop about a hundred times a step:
// one wait at the end, not one a weight).
#define JOB_PARTS AG_JOBS_MAX
typedef struct {
    const ag_job *jobs;
    int nparts;
    int job[JOB_PARTS];                                     // the loop each part is of
    int64_t lo[JOB_PARTS], hi[JOB_PARTS], chunk[JOB_PARTS]; // its items and chunk size
    int64_t first[JOB_PARTS + 1];                           // index of each part's first chunk
} jobs_arg;

static void jobs_part(void *p, int64_t lo, int64_t hi, int thread) {
    const jobs_arg *a = p;
    int j = 0;
    for (int64_t c = lo; c < hi; c++) {
        while (c >= a->first[j + 1]) j++;
        const ag_job *job = &a->jobs[a->job[j]];
        int64_t b = a->lo[j] + (c - a->first[j]) * a->chunk[j],
                e = b + a->chunk[j] < a->hi[j] ? b + a->chunk[j] : a->hi[j];
        job->fn(job->arg, b, e, thread);
    }
}

static void add_part(jobs_arg *a, int job, int64_t lo, int64_t hi, int64_t chunk) {
    if (hi <= lo) return;
    int k = a->nparts++;
    a->job[k] = job, a->lo[k] = lo, a->hi[k] = hi, a->chunk[k] = chunk;
    a->first[k + 1] = a->first[k] + (hi - lo + chunk - 1) / chunk;
}

void ag_parallel_jobs(int njobs, const ag_job *jobs) {
    jobs_arg a = {.jobs = jobs};
    int64_t nt = ag_num_threads();
    if (njobs > AG_JOBS_MAX) njobs = AG_JOBS_MAX;
    for (int j = 0; j < njobs; j++) {
        int64_t n = jobs[j].n > 0 ? jobs[j].n : 0, chunk = (n + 4 * nt - 1) / (4 * nt);
        if (n < 2 * jobs[j].grain) chunk = n;
        chunk = chunk < jobs[j].grain ? jobs[j].grain : chunk;
        if (chunk < 1) chunk = 1;
        add_part(&a, j, 0, n, chunk);
    }
    run(a.first[a.nparts], 1, jobs_part, &a);
}

// Until set, as many threads as the process may use cores.
int ag_num_threads(void) {
    int n = atomic_load(&pool.threads);
    if (n > 0) return n;
    cpu_set_t set;
    n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    ag_pool_set_threads(n);
    return atomic_load(&pool.threads);
}

void ag_pool_set_threads(int n) {
    if (n < 1) n = 1;
    if (n > POOL_MAX) n = POOL_MAX;
    pthread_mutex_lock(&pool.lock);
    while (pool.started < n - 1) {
        int id = pool.started + 1;
        if (pthread_create(&pool.th[pool.started], NULL, worker, (void *)(intptr_t)id) != 0) break;
        pthread_detach(pool.th[pool.started]);
        pool.started++;
    }
    pool.threads = pool.started + 1 < n ? pool.started + 1 : n;
    pthread_mutex_unlock(&pool.lock);
}

void ag_set_num_threads(int n) {
    if (n >= 1) ag_pool_set_threads(n);
}
