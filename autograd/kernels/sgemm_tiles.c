// Float32 products on packed tiles with AVX-512 (ag_sgemm_tiles): C = alpha op(A) op(B) + beta C.
//
// GotoBLAS's blocking with an 8 x 48 kernel: op(A) packed in panels of 8 rows and op(B) in panels
// of 48 columns, both k-major, so that each step of k is 3 vector loads of B, 8 broadcasts of A
// and 24 FMAs into 24 accumulators that stay in registers. A B panel (KC x 48, 36 KB) stays in
// L1 while the A panels of its block stream from L2. The pool splits C into strips along its
// longer side; each strip packs its own part of one operand, and the other, which every strip
// reads, is packed once by all threads beforehand. A product far deeper than it is wide is split
// along K instead. Packing is by 16 x 16 transposes in registers. ag_sgemm runs these where the
// kernels OpenBLAS picked (by CPU model, or OPENBLAS_CORETYPE) are not AVX-512 ones.
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#include "ag_kernels.h"

#define MR 8   // kernel rows
#define NR 48  // kernel columns (three vectors)
#define MC 192 // rows of op(A) a block packs
#define NC 288 // columns of op(B) a block packs
#define KC 192 // depth of a block: a B panel is KC x NR floats (36 KB)
// A strip's own operand, packed whole per depth block: at most this many columns of op(B) (a
// strip along N, 442 KB) or rows of op(A) (along M, 295 KB), beside a block of the other in L2.
#define STRIP_COLS (2 * NC)
#define STRIP_ROWS (2 * MC)

static int forced = -1; // -1: the run-time choice

void ag_sgemm_tiles_force(int on) { forced = on < 0 ? -1 : on ? 1 : 0; }

#if defined(__x86_64__)

// ---- per-thread workspace: mapped, as OpenBLAS maps its own buffers (not a malloc: the bill
// of a float32 run does not change with the kernels that multiply its matrices) ----

#define WS_BYTES ((size_t)(STRIP_ROWS + STRIP_COLS) * KC * sizeof(float))

static pthread_key_t ws_key;
static pthread_once_t ws_once = PTHREAD_ONCE_INIT;
static void ws_unmap(void *p) { munmap(p, WS_BYTES); }
static void ws_make_key(void) { (void)pthread_key_create(&ws_key, ws_unmap); }

static float *workspace(void) {
    pthread_once(&ws_once, ws_make_key);
    float *p = pthread_getspecific(ws_key);
    if (p) return p;
    p = mmap(NULL, WS_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    if (pthread_setspecific(ws_key, p) != 0) {
        munmap(p, WS_BYTES);
        return NULL;
    }
    return p;
}

typedef struct {
    bool ta, tb;
    int64_t M, N, K, lda, ldb, ldc;
    float alpha, beta;
    const float *A, *B;
    float *C;
    bool by_cols;  // strips along N (else along M)
    int64_t strip; // a strip's columns (by_cols) or rows
    float *shared; // the operand all strips read (op(A) by_cols, else op(B)), packed whole; or NULL
    int64_t pad;   // its rows (columns) rounded up to whole panels
} tiles;

// A block read row by row takes a short piece of each stored row (a strip's columns): too short
// for the hardware's stream prefetch, so each row's piece is asked for PF_ROWS rows ahead.
#define PF_ROWS 8

AG_AVX512_INLINE void prefetch_row(const float *p, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) _mm_prefetch((const char *)(p + i), _MM_HINT_T0);
}

// 16 stored rows (ld apart, rows past `rows` zero), 16 elements each (fewer: `cols` left, the
// rest zero), transposed: r[c] holds element c of each row.
AG_AVX512_INLINE void load_transposed(__m512i r[16], const float *X, int64_t ld, int64_t rows, int64_t cols) {
    __mmask16 km = ag_lanes16(cols);
    for (int i = 0; i < 16; i++) r[i] = i < rows ? _mm512_maskz_loadu_epi32(km, X + i * ld) : _mm512_setzero_si512();
    ag_transpose16(r);
}

// Rows [m0, m0 + mc) of op(A), depth [k0, k0 + kc), into panels of MR rows: P[panel][k][row].
// Rows past mc are zero.
AG_AVX512 static void pack_a(const tiles *g, int64_t m0, int64_t mc, int64_t k0, int64_t kc, float *P) {
    int64_t panels = (mc + MR - 1) / MR;
    if (g->ta) { // stored [K, M]: the block's elements at each k are contiguous, read row by row
        for (int64_t k = 0; k < kc; k++) {
            const float *src = g->A + (k0 + k) * g->lda + m0;
            prefetch_row(src + PF_ROWS * g->lda, mc);
            for (int64_t ip = 0; ip < panels; ip += 2) {
                __m512 v = _mm512_maskz_loadu_ps(ag_lanes16(mc - ip * MR), src + ip * MR);
                _mm256_storeu_ps(P + ip * kc * MR + k * MR, _mm512_castps512_ps256(v));
                if (ip + 1 < panels)
                    _mm256_storeu_ps(P + (ip + 1) * kc * MR + k * MR,
                                     _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
            }
        }
        return;
    }
    // Rows contiguous along k: 16 rows x 16 k transposed at once, half to each of two panels.
    for (int64_t rb = 0; rb * 16 < mc; rb++)
        for (int64_t kb = 0; kb < kc; kb += 16) {
            __m512i r[16];
            load_transposed(r, g->A + (m0 + 16 * rb) * g->lda + k0 + kb, g->lda, mc - 16 * rb, kc - kb);
            int64_t nk = kc - kb < 16 ? kc - kb : 16;
            float *p0 = P + (2 * rb) * kc * MR + kb * MR, *p1 = p0 + kc * MR;
            for (int64_t k = 0; k < nk; k++) {
                _mm256_storeu_si256((__m256i *)(p0 + k * MR), _mm512_castsi512_si256(r[k]));
                if (16 * rb + 8 < mc) _mm256_storeu_si256((__m256i *)(p1 + k * MR), _mm512_extracti64x4_epi64(r[k], 1));
            }
        }
}

// Columns [n0, n0 + nc) of op(B), depth [k0, k0 + kc), into panels of NR: P[panel][k][column].
// Columns past nc are zero.
AG_AVX512 static void pack_b(const tiles *g, int64_t n0, int64_t nc, int64_t k0, int64_t kc, float *P) {
    int64_t vecs = (nc + NR - 1) / NR * 3; // 16-column vectors, whole panels
    if (!g->tb) { // stored [K, N]: the block's columns at each k are contiguous, read row by row
        for (int64_t k = 0; k < kc; k++) {
            const float *src = g->B + (k0 + k) * g->ldb + n0;
            prefetch_row(src + PF_ROWS * g->ldb, nc);
            for (int64_t cb = 0; cb < vecs; cb++)
                _mm512_storeu_ps(P + (cb / 3) * kc * NR + k * NR + (cb % 3) * 16,
                                 _mm512_maskz_loadu_ps(ag_lanes16(nc - 16 * cb), src + 16 * cb));
        }
        return;
    }
    // Stored [N, K] (a weight w[out, in]): 16 columns x 16 k transposed at once.
    for (int64_t cb = 0; cb < vecs; cb++)
        for (int64_t kb = 0; kb < kc; kb += 16) {
            __m512i r[16];
            load_transposed(r, g->B + (n0 + 16 * cb) * g->ldb + k0 + kb, g->ldb, nc - 16 * cb, kc - kb);
            int64_t nk = kc - kb < 16 ? kc - kb : 16;
            float *dst = P + (cb / 3) * kc * NR + kb * NR + (cb % 3) * 16;
            for (int64_t k = 0; k < nk; k++) _mm512_storeu_si512(dst + k * NR, r[k]);
        }
}

// C[mr, nc (<= 48)] = alpha a·b + (accumulate ? C : beta C), over kc steps of packed panels;
// beta 0 does not read C.
AG_AVX512_INLINE void kernel(int mr, int64_t kc, const float *a, const float *b, float *c, int64_t ldc, int64_t nc,
                             float alpha, float beta, bool accumulate) {
    __m512 acc[MR][3];
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++) acc[i][0] = acc[i][1] = acc[i][2] = _mm512_setzero_ps();
    for (int64_t k = 0; k < kc; k++) {
        __m512 b0 = _mm512_loadu_ps(b + k * NR), b1 = _mm512_loadu_ps(b + k * NR + 16);
        __m512 b2 = _mm512_loadu_ps(b + k * NR + 32);
#pragma GCC unroll 8
        for (int i = 0; i < mr; i++) {
            __m512 av = _mm512_set1_ps(a[k * MR + i]);
            acc[i][0] = _mm512_fmadd_ps(av, b0, acc[i][0]);
            acc[i][1] = _mm512_fmadd_ps(av, b1, acc[i][1]);
            acc[i][2] = _mm512_fmadd_ps(av, b2, acc[i][2]);
        }
    }
    __mmask16 m[3] = {ag_lanes16(nc), ag_lanes16(nc - 16), ag_lanes16(nc - 32)};
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++)
        for (int q = 0; q < 3; q++)
            if (m[q]) {
                float *cp = c + i * ldc + 16 * q;
                _mm512_mask_storeu_ps(cp, m[q], ag_tile_result(acc[i][q], cp, m[q], alpha, beta, accumulate));
            }
}

AG_AVX512 static void kernel_rows(int mr, int64_t kc, const float *a, const float *b, float *c, int64_t ldc, int64_t nc,
                                  float alpha, float beta, bool acc) {
    switch (mr) {
    case 8: kernel(8, kc, a, b, c, ldc, nc, alpha, beta, acc); break;
    case 7: kernel(7, kc, a, b, c, ldc, nc, alpha, beta, acc); break;
    case 6: kernel(6, kc, a, b, c, ldc, nc, alpha, beta, acc); break;
    case 5: kernel(5, kc, a, b, c, ldc, nc, alpha, beta, acc); break;
    case 4: kernel(4, kc, a, b, c, ldc, nc, alpha, beta, acc); break;
    case 3: kernel(3, kc, a, b, c, ldc, nc, alpha, beta, acc); break;
    case 2: kernel(2, kc, a, b, c, ldc, nc, alpha, beta, acc); break;
    default: kernel(1, kc, a, b, c, ldc, nc, alpha, beta, acc); break;
    }
}

// The kernels over C[mb, mb + mc) x [nb, nb + nc) from packed blocks: each B panel (in L1)
// against every A panel of the block (in L2).
static void block(const tiles *g, const float *Ap, const float *Bp, int64_t mb, int64_t mc, int64_t nb, int64_t nc,
                  int64_t kc, bool acc) {
    for (int64_t j = 0; j < nc; j += NR)
        for (int64_t i = 0; i < mc; i += MR)
            kernel_rows(mc - i < MR ? (int)(mc - i) : MR, kc, Ap + (i / MR) * kc * MR, Bp + (j / NR) * kc * NR,
                        g->C + (mb + i) * g->ldc + nb + j, g->ldc, nc - j, g->alpha, g->beta, acc);
}

// C[m0, m1) x [n0, n1), one strip: per depth block the strip's own part of its operand is packed
// once (its columns of op(B), or its rows of op(A)); the other operand is read from g->shared, or
// packed a block at a time.
static void region(const tiles *g, int64_t m0, int64_t m1, int64_t n0, int64_t n1, float *ws) {
    float *Ap = ws, *Bp = ws + STRIP_ROWS * KC;
    for (int64_t k0 = 0; k0 < g->K; k0 += KC) {
        int64_t kc = g->K - k0 < KC ? g->K - k0 : KC;
        bool acc = k0 > 0;
        float *sh = g->shared ? g->shared + k0 * g->pad : NULL;
        if (g->by_cols) {
            pack_b(g, n0, n1 - n0, k0, kc, Bp);
            for (int64_t mb = m0; mb < m1; mb += MC) {
                int64_t mc = m1 - mb < MC ? m1 - mb : MC;
                const float *a = sh ? sh + (mb / MR) * kc * MR : Ap;
                if (!sh) pack_a(g, mb, mc, k0, kc, Ap);
                block(g, a, Bp, mb, mc, n0, n1 - n0, kc, acc);
            }
        } else {
            pack_a(g, m0, m1 - m0, k0, kc, Ap);
            for (int64_t nb = n0; nb < n1; nb += NC) {
                int64_t nc = n1 - nb < NC ? n1 - nb : NC;
                const float *b = sh ? sh + (nb / NR) * kc * NR : Bp;
                if (!sh) pack_b(g, nb, nc, k0, kc, Bp);
                block(g, Ap, b, m0, m1 - m0, nb, nc, kc, acc);
            }
        }
    }
}

// The shared operand's blocks [lo, hi): a block is one depth block of MC rows (NC columns).
static void share_part(void *p, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const tiles *g = p;
    int64_t side = g->by_cols ? g->M : g->N, step = g->by_cols ? MC : NC, per = (side + step - 1) / step;
    for (int64_t t = lo; t < hi; t++) {
        int64_t k0 = t / per * KC, x0 = t % per * step, kc = g->K - k0 < KC ? g->K - k0 : KC;
        int64_t xn = side - x0 < step ? side - x0 : step;
        float *dst = g->shared + k0 * g->pad + x0 * kc;
        if (g->by_cols)
            pack_a(g, x0, xn, k0, kc, dst);
        else
            pack_b(g, x0, xn, k0, kc, dst);
    }
}

// Without a workspace (a thread's could not be mapped): one element at a time.
static void naive_region(const tiles *g, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    for (int64_t i = m0; i < m1; i++)
        for (int64_t j = n0; j < n1; j++) {
            float s = 0.0f, *c = g->C + i * g->ldc + j;
            for (int64_t k = 0; k < g->K; k++)
                s += (g->ta ? g->A[k * g->lda + i] : g->A[i * g->lda + k]) *
                     (g->tb ? g->B[j * g->ldb + k] : g->B[k * g->ldb + j]);
            *c = g->beta != 0.0f ? g->alpha * s + g->beta * *c : g->alpha * s;
        }
}

static void region_or_naive(const tiles *g, int64_t m0, int64_t m1, int64_t n0, int64_t n1, float *ws) {
    if (ws)
        region(g, m0, m1, n0, n1, ws);
    else
        naive_region(g, m0, m1, n0, n1);
}

static void strip_part(void *p, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const tiles *g = p;
    float *ws = workspace();
    for (int64_t s = lo; s < hi; s++) {
        int64_t a = s * g->strip;
        if (g->by_cols)
            region_or_naive(g, 0, g->M, a, g->N - a < g->strip ? g->N : a + g->strip, ws);
        else
            region_or_naive(g, a, g->M - a < g->strip ? g->M : a + g->strip, 0, g->N, ws);
    }
}

// Strips along C's longer side: as wide as a block, narrower (in whole panels) when that leaves
// fewer than 4 a thread, so that a thread that loses its core leaves work for the others (one
// thread alone takes them as wide as a block: each strip reads the other operand again).
static int64_t strip_size(int64_t side, int64_t block, int64_t panel) {
    int64_t threads = ag_num_threads(), want = threads > 1 ? 4 * threads : 1, s = (side + want - 1) / want;
    s = (s + panel - 1) / panel * panel;
    return s > block ? block : s < panel ? panel : s;
}

// ---- one mapped buffer for the shared operand and the partial sums, kept between products ----

#define SHARED_MAX ((size_t)64 << 20)

static pthread_mutex_t big_lock = PTHREAD_MUTEX_INITIALIZER;
static float *big;
static size_t big_bytes;

// Held on success (unlock after the product); NULL when another product holds it or none can be had.
static float *big_take(size_t bytes) {
    if (bytes > SHARED_MAX || pthread_mutex_trylock(&big_lock) != 0) return NULL;
    if (big_bytes < bytes) {
        size_t want = (bytes + ((size_t)2 << 20) - 1) & ~(((size_t)2 << 20) - 1);
        void *p = mmap(NULL, want, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            pthread_mutex_unlock(&big_lock);
            return NULL;
        }
        if (big) munmap(big, big_bytes);
        big = p, big_bytes = want;
    }
    return big;
}

static void strips(tiles *g) {
    g->strip = g->by_cols ? strip_size(g->N, STRIP_COLS, NR) : strip_size(g->M, STRIP_ROWS, 16);
    ag_parallel_for(((g->by_cols ? g->N : g->M) + g->strip - 1) / g->strip, 1, strip_part, g);
}

// ---- a deep product (K far beyond M and N: an output head's dx) split along K ----
//
// Strips would each pack the whole of one operand again; parts of K pack each element once, each
// into its own partial C (part 0 into C itself), summed at the end.

typedef struct {
    const tiles *g;
    int64_t kpart;
    float *parts; // M x N floats a part past the first
} deep;

AG_AVX512 static void deep_part(void *p, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const deep *d = p;
    float *ws = workspace();
    for (int64_t q = lo; q < hi; q++) {
        tiles g = *d->g;
        int64_t k0 = q * d->kpart;
        g.K = g.K - k0 < d->kpart ? g.K - k0 : d->kpart;
        g.A += g.ta ? k0 * g.lda : k0;
        g.B += g.tb ? k0 : k0 * g.ldb;
        if (q > 0) g.C = d->parts + (q - 1) * g.M * g.N, g.ldc = g.N, g.beta = 0.0f;
        g.by_cols = true;
        for (int64_t n0 = 0; n0 < g.N; n0 += STRIP_COLS)
            region_or_naive(&g, 0, g.M, n0, g.N - n0 < STRIP_COLS ? g.N : n0 + STRIP_COLS, ws);
    }
}

typedef struct {
    float *C;
    const float *parts;
    int64_t N, ldc, nparts, MN;
} deep_sum;

AG_AVX512 static void sum_part(void *p, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const deep_sum *d = p;
    for (int64_t i = lo; i < hi; i++)
        for (int64_t j = 0; j < d->N; j += 16) {
            __mmask16 m = ag_lanes16(d->N - j);
            __m512 s = _mm512_maskz_loadu_ps(m, d->C + i * d->ldc + j);
            for (int64_t q = 0; q < d->nparts; q++)
                s = _mm512_add_ps(s, _mm512_maskz_loadu_ps(m, d->parts + q * d->MN + i * d->N + j));
            _mm512_mask_storeu_ps(d->C + i * d->ldc + j, m, s);
        }
}

static bool deep_product(const tiles *g) {
    // One thread takes strips as wide as a block, reading the deep operand once: nothing to split for.
    int64_t nparts = 2 * (int64_t)ag_num_threads();
    if (nparts < 4 || g->K < 8 * (g->M > g->N ? g->M : g->N)) return false;
    float *parts = big_take((size_t)(nparts - 1) * (size_t)(g->M * g->N) * sizeof(float));
    if (!parts) return false;
    deep d = {g, (g->K + nparts * KC - 1) / (nparts * KC) * KC, parts};
    nparts = (g->K + d.kpart - 1) / d.kpart;
    ag_parallel_for(nparts, 1, deep_part, &d);
    deep_sum s = {g->C, parts, g->N, g->ldc, nparts - 1, g->M * g->N};
    ag_parallel_for(g->M, (1 << 14) / g->N + 1, sum_part, &s);
    pthread_mutex_unlock(&big_lock);
    return true;
}

bool ag_sgemm_tiles(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K, float alpha,
                    const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    if (forced == 0 || !ag_has_avx512() || M < 1 || N < 1 || K < 1 || !workspace()) return false;
    tiles g = {ta == CblasTrans, tb == CblasTrans, M, N, K, lda, ldb, ldc, alpha, beta, A, B, C, N >= M, 0, NULL, 0};
    if (deep_product(&g)) return true;
    // The operand every strip reads, packed once by all threads where it fits the buffer.
    int64_t side = g.by_cols ? M : N, panel = g.by_cols ? MR : NR;
    g.pad = (side + panel - 1) / panel * panel;
    int64_t step = g.by_cols ? MC : NC, blocks = (K + KC - 1) / KC * ((side + step - 1) / step);
    g.shared = ag_num_threads() > 1 ? big_take((size_t)(g.pad * K) * sizeof(float)) : NULL;
    if (g.shared) ag_parallel_for(blocks, 1, share_part, &g);
    strips(&g);
    if (g.shared) pthread_mutex_unlock(&big_lock);
    return true;
}

bool ag_sgemm_tiles_pays(int64_t M, int64_t N, int64_t K) {
    if (forced >= 0) return forced == 1 && ag_has_avx512();
    return M >= 8 && N >= 48 && K >= 16 && ag_blas_prefers_tiles();
}
#else
bool ag_sgemm_tiles(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K, float alpha,
                    const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)lda, (void)B;
    (void)ldb, (void)beta, (void)C, (void)ldc;
    return false;
}
bool ag_sgemm_tiles_pays(int64_t M, int64_t N, int64_t K) {
    (void)M, (void)N, (void)K;
    return false;
}
#endif
