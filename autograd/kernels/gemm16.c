// 16-bit matrix products with float32 accumulation (ag_gemm_16, ag_gemm_16_out).
//
// On AVX512-BF16 CPUs bfloat16 products run vdpbf16ps: each instruction multiplies 16 pairs of
// adjacent-k elements and adds both products to 16 float32 sums, twice the multiply-adds of a
// float32 FMA. Operands are packed per tile as pairs (k, k+1) in one 32-bit word, A in panels of
// 8 rows, B in panels of 48 columns, and an 8 x 48 kernel keeps 24 accumulators in registers
// (GotoBLAS's blocking: a B panel stays in L1 while the A panels stream from L2), on CPUs where
// vdpbf16ps keeps near float32 FMA's multiply-adds a second (ag_cpu_bf16_dot_pays). With few rows
// and op(B) = w's rows (a decode step's linear) the weight is streamed once unpacked instead.
// Everything else converts tiles to float32 and runs single-threaded sgemm on them.
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ag_kernels.h"

#define MR 8  // kernel rows
#define NR 48 // kernel columns (three vectors)

// ---- per-thread scratch ----

static pthread_key_t ws_key;
static pthread_once_t ws_once = PTHREAD_ONCE_INIT;
static void ws_make_key(void) { (void)pthread_key_create(&ws_key, free); }

// The block starts with its usable size; the caller gets the next 64 bytes on.
void *ag_kernel_ws(size_t bytes) {
    pthread_once(&ws_once, ws_make_key);
    unsigned char *p = pthread_getspecific(ws_key);
    if (p && *(size_t *)p >= bytes) return p + 64;
    free(p);
    (void)pthread_setspecific(ws_key, NULL);
    size_t want = (bytes + 64 + 4095) / 4096 * 4096;
    p = aligned_alloc(64, want);
    if (!p) return NULL;
    *(size_t *)p = want - 64;
    if (pthread_setspecific(ws_key, p) != 0) {
        free(p);
        return NULL;
    }
    return p + 64;
}

typedef struct {
    ag_dtype t;
    bool ta, tb; // transposed
    int64_t M, N, K, lda, ldb, ldc;
    float alpha, beta;
    const uint16_t *A, *B;
    float *C;    // float32 result, or NULL
    uint16_t *D; // 16-bit result (ag_gemm_16_out), or NULL
    int64_t mtiles, ntiles, nc;
    bool n_major;  // tasks that follow each other share op(B)'s tile, not op(A)'s
    uint64_t call; // this product's number, for the panels a thread keeps between its tiles
} g16;

static inline uint16_t a_at(const g16 *g, int64_t i, int64_t k) {
    return g->ta ? g->A[k * g->lda + i] : g->A[i * g->lda + k];
}
static inline uint16_t b_at(const g16 *g, int64_t k, int64_t j) {
    return g->tb ? g->B[j * g->ldb + k] : g->B[k * g->ldb + j];
}
static inline float to_f32(ag_dtype t, uint16_t h) { return t == AG_BF16 ? ag_bf16_to_f32(h) : ag_f16_to_f32(h); }
static inline uint16_t from_f32(ag_dtype t, float f) { return t == AG_BF16 ? ag_bf16_from_f32(f) : ag_f16_from_f32(f); }

// The 16-bit result of a float32 tile T[mc, nc] (rows ldt apart): D = T + beta D, rounded once.
static void narrow_tile(const g16 *g, const float *T, int64_t ldt, int64_t m0, int64_t n0, int64_t mc, int64_t nc) {
    const ag_type_traits *tr = ag_type_traits_of(g->t);
    float row[AG_GEMM16_NC];
    for (int64_t i = 0; i < mc; i++) {
        uint16_t *d = g->D + (m0 + i) * g->ldc + n0;
        const float *src = T + i * ldt;
        if (g->beta != 0.0f) {
            tr->to_f32(d, row, nc);
            for (int64_t j = 0; j < nc; j++) row[j] = src[j] + g->beta * row[j];
            src = row;
        }
        tr->from_f32(src, d, nc);
    }
}

// ---- portable: tiles converted to float32, single-threaded sgemm ----

// op(X)'s tile as stored: rows [r0, r0 + nr) of X, columns [c0, c0 + ncols), into T (ncols apart).
static void convert_tile(ag_dtype t, const uint16_t *X, int64_t ld, int64_t r0, int64_t nr, int64_t c0, int64_t ncols,
                         float *T) {
    const ag_type_traits *tr = ag_type_traits_of(t);
    for (int64_t r = 0; r < nr; r++) tr->to_f32(X + (r0 + r) * ld + c0, T + r * ncols, ncols);
}

static void portable_tile(const g16 *g, int64_t m0, int64_t mc, int64_t n0, int64_t nc, float *ws) {
    float *At = ws, *Bt = ws + AG_GEMM16_MC * AG_GEMM16_KC, *Ct = Bt + AG_GEMM16_NC * AG_GEMM16_KC;
    float *C = g->D ? Ct : g->C + m0 * g->ldc + n0;
    int64_t ldc = g->D ? nc : g->ldc;
    for (int64_t k0 = 0; k0 < g->K; k0 += AG_GEMM16_KC) {
        int64_t kc = g->K - k0 < AG_GEMM16_KC ? g->K - k0 : AG_GEMM16_KC;
        // Stored as op() reads them, so sgemm takes the same transposes.
        if (g->ta)
            convert_tile(g->t, g->A, g->lda, k0, kc, m0, mc, At);
        else
            convert_tile(g->t, g->A, g->lda, m0, mc, k0, kc, At);
        if (g->tb)
            convert_tile(g->t, g->B, g->ldb, n0, nc, k0, kc, Bt);
        else
            convert_tile(g->t, g->B, g->ldb, k0, kc, n0, nc, Bt);
        float beta = k0 ? 1.0f : g->D ? 0.0f : g->beta;
        CBLAS_TRANSPOSE ta = g->ta ? CblasTrans : CblasNoTrans, tb = g->tb ? CblasTrans : CblasNoTrans;
        int64_t lda = g->ta ? mc : kc, ldb = g->tb ? kc : nc;
        // The float32 tiles where OpenBLAS's own kernels would be slower (in a part of the pool's
        // loop they run on this thread alone).
        if (!(ag_sgemm_tiles_pays(mc, nc, kc) &&
              ag_sgemm_tiles(ta, tb, mc, nc, kc, g->alpha, At, lda, Bt, ldb, beta, C, ldc)))
            cblas_sgemm(CblasRowMajor, ta, tb, (blasint)mc, (blasint)nc, (blasint)kc, g->alpha, At, (blasint)lda, Bt,
                        (blasint)ldb, beta, C, (blasint)ldc);
    }
    if (g->D) narrow_tile(g, Ct, nc, m0, n0, mc, nc);
}

// Without workspace (it could not be had), or K = 0: one element at a time.
static void naive_tile(const g16 *g, int64_t m0, int64_t mc, int64_t n0, int64_t nc) {
    for (int64_t i = m0; i < m0 + mc; i++)
        for (int64_t j = n0; j < n0 + nc; j++) {
            float s = 0.0f;
            for (int64_t k = 0; k < g->K; k++) s += to_f32(g->t, a_at(g, i, k)) * to_f32(g->t, b_at(g, k, j));
            s *= g->alpha;
            if (g->D) {
                uint16_t *d = g->D + i * g->ldc + j;
                if (g->beta != 0.0f) s += g->beta * to_f32(g->t, *d);
                *d = from_f32(g->t, s);
            } else {
                float *c = g->C + i * g->ldc + j;
                *c = g->beta != 0.0f ? s + g->beta * *c : s;
            }
        }
}

#if defined(__x86_64__)
#define BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,fma")))
#define BF16_INLINE static inline __attribute__((always_inline)) BF16_TARGET

static inline __mmask32 lanes32(int64_t left) {
    return left <= 0 ? 0 : left >= 32 ? (__mmask32)0xFFFFFFFFu : (__mmask32)((1u << left) - 1);
}

// 16 stored rows, each contiguous along k, from k0: words (k, k+1) of pairs [16 pb, 16 pb + 16),
// transposed so that out[p] holds the 16 rows' words of pair p. Rows past nrows read as zero.
BF16_INLINE void load_pairs16(__m512i r[16], const uint16_t *X, int64_t ld, int64_t nrows, int64_t k0, int64_t kc,
                              int64_t pb) {
    __mmask32 km = lanes32(kc - 32 * pb);
    for (int i = 0; i < 16; i++)
        r[i] = i < nrows ? _mm512_maskz_loadu_epi16(km, X + i * ld + k0 + 32 * pb) : _mm512_setzero_si512();
    ag_transpose16(r);
}

// A panels: 8 rows, step p holding the rows' (k, k+1) words. kp pairs a panel.
BF16_TARGET static void pack_a(const g16 *g, int64_t m0, int64_t mc, int64_t k0, int64_t kc, uint32_t *P) {
    int64_t kp = (kc + 1) / 2;
    if (!g->ta) { // rows of A contiguous along k: 16 rows at once, transposed, half to each panel
        for (int64_t rb = 0; rb * 16 < mc; rb++)
            for (int64_t pb = 0; pb * 16 < kp; pb++) {
                __m512i r[16];
                load_pairs16(r, g->A + (m0 + 16 * rb) * g->lda, g->lda, mc - 16 * rb, k0, kc, pb);
                int64_t np = kp - 16 * pb < 16 ? kp - 16 * pb : 16;
                uint32_t *p0 = P + (2 * rb) * kp * MR + 16 * pb * MR, *p1 = p0 + kp * MR;
                for (int64_t p = 0; p < np; p++) {
                    _mm256_storeu_si256((__m256i *)(p0 + p * MR), _mm512_castsi512_si256(r[p]));
                    if (16 * rb + 8 < mc)
                        _mm256_storeu_si256((__m256i *)(p1 + p * MR), _mm512_extracti64x4_epi64(r[p], 1));
                }
            }
        return;
    }
    // Aᵀ stored: rows k and k+1 hold the panel's 8 elements each; interleave them.
    for (int64_t ip = 0; ip * MR < mc; ip++) {
        __mmask8 m = (__mmask8)(mc - ip * MR >= 8 ? 0xFF : (1u << (mc - ip * MR)) - 1);
        uint32_t *dst = P + ip * kp * MR;
        for (int64_t p = 0; p < kp; p++) {
            const uint16_t *r0 = g->A + (k0 + 2 * p) * g->lda + m0 + ip * MR;
            __m128i x0 = _mm_maskz_loadu_epi16(m, r0);
            __m128i x1 = 2 * p + 1 < kc ? _mm_maskz_loadu_epi16(m, r0 + g->lda) : _mm_setzero_si128();
            _mm_storeu_si128((__m128i *)(dst + p * MR), _mm_unpacklo_epi16(x0, x1));
            _mm_storeu_si128((__m128i *)(dst + p * MR + 4), _mm_unpackhi_epi16(x0, x1));
        }
    }
}

// B panels: 48 columns, step p holding the columns' (k, k+1) words. Columns past nc are zero.
BF16_TARGET static void pack_b(const g16 *g, int64_t n0, int64_t nc, int64_t k0, int64_t kc, uint32_t *P) {
    int64_t kp = (kc + 1) / 2, nblocks = (nc + NR - 1) / NR * 3;
    if (g->tb) { // w[N, K] stored: each column contiguous along k, 16 columns transposed at once
        for (int64_t cb = 0; cb < nblocks; cb++)
            for (int64_t pb = 0; pb * 16 < kp; pb++) {
                __m512i r[16];
                load_pairs16(r, g->B + (n0 + 16 * cb) * g->ldb, g->ldb, nc - 16 * cb, k0, kc, pb);
                int64_t np = kp - 16 * pb < 16 ? kp - 16 * pb : 16;
                uint32_t *dst = P + (cb / 3) * kp * NR + 16 * pb * NR + (cb % 3) * 16;
                for (int64_t p = 0; p < np; p++) _mm512_storeu_si512(dst + p * NR, r[p]);
            }
        return;
    }
    // Rows k and k+1 of B, 16 columns interleaved word by word.
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21,
                                         5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    for (int64_t cb = 0; cb < nblocks; cb++) {
        int64_t left = nc - 16 * cb;
        __mmask16 m = ag_lanes16(left);
        uint32_t *dst = P + (cb / 3) * kp * NR + (cb % 3) * 16;
        for (int64_t p = 0; p < kp; p++) {
            const uint16_t *r0 = g->B + (k0 + 2 * p) * g->ldb + n0 + 16 * cb;
            __m256i x0 = _mm256_maskz_loadu_epi16(m, r0);
            __m256i x1 = 2 * p + 1 < kc ? _mm256_maskz_loadu_epi16(m, r0 + g->ldb) : _mm256_setzero_si256();
            __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(x0), x1, 1);
            _mm512_storeu_si512(dst + p * NR, _mm512_permutexvar_epi16(idx, v));
        }
    }
}

// C[mr, 48 (nc valid)] (=|+=) alpha A-panel · B-panel over kp pairs. accumulate: add to C;
// otherwise C = alpha AB + beta C (beta 0: C not read). With d (a 16-bit result's last block of
// K) the sum goes to d instead, d = sum + beta d rounded once, as narrow_tile would round it.
BF16_INLINE void kernel(int mr, int64_t kp, const uint32_t *a, const uint32_t *b, float *c, int64_t ldc, int64_t nc,
                        float alpha, float beta, bool accumulate, uint16_t *d, int64_t ldd, float beta_d) {
    __m512 acc[MR][3];
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++) acc[i][0] = acc[i][1] = acc[i][2] = _mm512_setzero_ps();
    for (int64_t p = 0; p < kp; p++) {
        __m512bh b0 = (__m512bh)_mm512_loadu_si512(b + p * NR), b1 = (__m512bh)_mm512_loadu_si512(b + p * NR + 16);
        __m512bh b2 = (__m512bh)_mm512_loadu_si512(b + p * NR + 32);
#pragma GCC unroll 8
        for (int i = 0; i < mr; i++) {
            __m512bh av = (__m512bh)_mm512_set1_epi32((int)a[p * MR + i]);
            acc[i][0] = _mm512_dpbf16_ps(acc[i][0], av, b0);
            acc[i][1] = _mm512_dpbf16_ps(acc[i][1], av, b1);
            acc[i][2] = _mm512_dpbf16_ps(acc[i][2], av, b2);
        }
    }
    __mmask16 m[3] = {ag_lanes16(nc), ag_lanes16(nc - 16), ag_lanes16(nc - 32)};
    __m512 vbd = _mm512_set1_ps(beta_d);
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++)
        for (int q = 0; q < 3; q++) {
            if (!m[q]) continue;
            float *cp = c + i * ldc + 16 * q;
            __m512 r = ag_tile_result(acc[i][q], cp, m[q], alpha, beta, accumulate);
            if (!d) {
                _mm512_mask_storeu_ps(cp, m[q], r);
                continue;
            }
            uint16_t *dp = d + i * ldd + 16 * q;
            if (beta_d != 0.0f) {
                __m512i h = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m[q], dp));
                r = _mm512_add_ps(r, _mm512_mul_ps(vbd, _mm512_castsi512_ps(_mm512_slli_epi32(h, 16))));
            }
            _mm256_mask_storeu_epi16(dp, m[q], ag_bf16_round16(r));
        }
}

BF16_TARGET static void kernel_rows(int mr, int64_t kp, const uint32_t *a, const uint32_t *b, float *c, int64_t ldc,
                                    int64_t nc, float alpha, float beta, bool acc, uint16_t *d, int64_t ldd,
                                    float beta_d) {
    switch (mr) {
    case 8: kernel(8, kp, a, b, c, ldc, nc, alpha, beta, acc, d, ldd, beta_d); break;
    case 7: kernel(7, kp, a, b, c, ldc, nc, alpha, beta, acc, d, ldd, beta_d); break;
    case 6: kernel(6, kp, a, b, c, ldc, nc, alpha, beta, acc, d, ldd, beta_d); break;
    case 5: kernel(5, kp, a, b, c, ldc, nc, alpha, beta, acc, d, ldd, beta_d); break;
    case 4: kernel(4, kp, a, b, c, ldc, nc, alpha, beta, acc, d, ldd, beta_d); break;
    case 3: kernel(3, kp, a, b, c, ldc, nc, alpha, beta, acc, d, ldd, beta_d); break;
    case 2: kernel(2, kp, a, b, c, ldc, nc, alpha, beta, acc, d, ldd, beta_d); break;
    default: kernel(1, kp, a, b, c, ldc, nc, alpha, beta, acc, d, ldd, beta_d); break;
    }
}

// Blocks of K whose packed panels a thread keeps: a product with K up to this many blocks packs
// the operand its consecutive tiles share once, not once a tile; a deeper one packs a block at a
// time into one slot, as before.
#define KEEP_KBLOCKS 4

static bool panels_kept(int64_t K) { return K <= KEEP_KBLOCKS * AG_GEMM16_KC; }
static int64_t panel_slots(int64_t K) { return panels_kept(K) ? (K + AG_GEMM16_KC - 1) / AG_GEMM16_KC : 1; }

static size_t tile_ws_bytes(int64_t K) {
    size_t bytes = (size_t)panel_slots(K) * (AG_GEMM16_MC + AG_GEMM16_NC) * AG_GEMM16_KC * 2 +
                   (size_t)AG_GEMM16_MC * AG_GEMM16_NC * 4 + 128;
    return bytes > AG_GEMM16_WS_BYTES ? bytes : AG_GEMM16_WS_BYTES;
}

// packed_a, packed_b: the workspace holds those panels already, from this thread's previous tile
// of the same product (then every block of K is kept).
BF16_TARGET static void bf16_tile(const g16 *g, int64_t m0, int64_t mc, int64_t n0, int64_t nc, unsigned char *ws,
                                  bool packed_a, bool packed_b) {
    const int64_t slots = panel_slots(g->K), a_block = AG_GEMM16_MC * AG_GEMM16_KC / 2,
                  b_block = AG_GEMM16_NC * AG_GEMM16_KC / 2;
    uint32_t *Ak = (uint32_t *)ws, *Bk = Ak + slots * a_block;
    float *Ct = (float *)(Bk + slots * b_block);
    float *C = g->D ? Ct : g->C + m0 * g->ldc + n0;
    int64_t ldc = g->D ? nc : g->ldc;
    for (int64_t k0 = 0; k0 < g->K; k0 += AG_GEMM16_KC) {
        int64_t kc = g->K - k0 < AG_GEMM16_KC ? g->K - k0 : AG_GEMM16_KC, kp = (kc + 1) / 2;
        int64_t slot = slots > 1 ? k0 / AG_GEMM16_KC : 0;
        uint32_t *Ap = Ak + slot * a_block, *Bp = Bk + slot * b_block;
        if (!packed_a) pack_a(g, m0, mc, k0, kc, Ap);
        if (!packed_b) pack_b(g, n0, nc, k0, kc, Bp);
        bool acc = k0 > 0;
        float beta = g->D ? 0.0f : g->beta;
        // A 16-bit result's last block rounds straight from the registers into D.
        uint16_t *D = g->D && k0 + kc >= g->K ? g->D + m0 * g->ldc + n0 : NULL;
        for (int64_t j = 0; j < nc; j += NR)
            for (int64_t i = 0; i < mc; i += MR)
                kernel_rows(mc - i < MR ? (int)(mc - i) : MR, kp, Ap + (i / MR) * kp * MR, Bp + (j / NR) * kp * NR,
                            C + i * ldc + j, ldc, nc - j, g->alpha, beta, acc, D ? D + i * g->ldc + j : NULL, g->ldc,
                            g->beta);
    }
}

// ---- few rows against w's rows, streamed once (decode) ----

#define SK_MR 6
#define SK_NR 4

// y[mr, nr] = alpha x[mr, K] · w[nr, K]ᵀ (+ beta y), 32 k a step.
BF16_INLINE void skinny_tile(const g16 *g, int mr, int nr, int64_t m0, int64_t n0) {
    const int64_t K = g->K;
    const uint16_t *x = g->A + m0 * g->lda, *w = g->B + n0 * g->ldb;
    __m512 acc[SK_MR][SK_NR];
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 8
        for (int j = 0; j < nr; j++) acc[i][j] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 32) {
        __mmask32 mk = lanes32(K - k);
        __m512bh wv[SK_NR];
#pragma GCC unroll 8
        for (int j = 0; j < nr; j++) {
            wv[j] = (__m512bh)_mm512_maskz_loadu_epi16(mk, w + j * g->ldb + k);
            _mm_prefetch((const char *)(w + (j + SK_NR) * g->ldb + k), _MM_HINT_T1);
        }
#pragma GCC unroll 8
        for (int i = 0; i < mr; i++) {
            __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(mk, x + i * g->lda + k);
#pragma GCC unroll 8
            for (int j = 0; j < nr; j++) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv, wv[j]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++) {
        float s[SK_NR];
        if (nr == SK_NR)
            _mm_storeu_ps(s, hsum4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]));
        else
            for (int j = 0; j < nr; j++) s[j] = _mm512_reduce_add_ps(acc[i][j]);
        for (int j = 0; j < nr; j++) {
            float v = g->alpha * s[j];
            int64_t at = (m0 + i) * g->ldc + n0 + j;
            if (g->D) {
                if (g->beta != 0.0f) v += g->beta * ag_bf16_to_f32(g->D[at]);
                g->D[at] = ag_bf16_from_f32(v);
            } else {
                g->C[at] = g->beta != 0.0f ? v + g->beta * g->C[at] : v;
            }
        }
    }
}

BF16_TARGET static void skinny_rows(const g16 *g, int nr, int64_t n0) {
    int64_t i = 0;
    for (; i + SK_MR <= g->M; i += SK_MR) skinny_tile(g, SK_MR, nr, i, n0);
    switch (g->M - i) {
    case 5: skinny_tile(g, 5, nr, i, n0); break;
    case 4: skinny_tile(g, 4, nr, i, n0); break;
    case 3: skinny_tile(g, 3, nr, i, n0); break;
    case 2: skinny_tile(g, 2, nr, i, n0); break;
    case 1: skinny_tile(g, 1, nr, i, n0); break;
    default: break;
    }
}

static void skinny_part(void *p, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const g16 *g = p;
    for (int64_t b = lo; b < hi; b++) skinny_rows(g, SK_NR, b * SK_NR);
}

static void skinny(const g16 *g) {
    int64_t blocks = g->N / SK_NR, grain = ((int64_t)1 << 16) / (SK_NR * g->K * 2 + 1) + 1;
    ag_parallel_for(blocks, grain, skinny_part, (void *)g);
    for (int64_t n = blocks * SK_NR; n < g->N; n++) skinny_rows(g, 1, n);
}
#endif

// ---- tiles on the pool ----

static void tile_part(void *p, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const g16 *g = p;
    unsigned char *ws = ag_kernel_ws(tile_ws_bytes(g->K));
    // The panels this thread's workspace holds: of which product and which tiles.
    static _Thread_local struct {
        uint64_t call;
        const unsigned char *ws;
        int64_t mt, nt;
    } kept;
    if (kept.call != g->call || kept.ws != ws) kept.call = g->call, kept.ws = ws, kept.mt = kept.nt = -1;
    for (int64_t t = lo; t < hi; t++) {
        int64_t mt = g->n_major ? t % g->mtiles : t / g->ntiles, nt = g->n_major ? t / g->mtiles : t % g->ntiles;
        int64_t m0 = mt * AG_GEMM16_MC, n0 = nt * g->nc;
        int64_t mc = g->M - m0 < AG_GEMM16_MC ? g->M - m0 : AG_GEMM16_MC, nc = g->N - n0 < g->nc ? g->N - n0 : g->nc;
        if (!ws) naive_tile(g, m0, mc, n0, nc);
#if defined(__x86_64__)
        else if (g->t == AG_BF16 && ag_cpu_bf16_dot_pays()) {
            bool keep = panels_kept(g->K);
            bf16_tile(g, m0, mc, n0, nc, ws, keep && mt == kept.mt, keep && nt == kept.nt);
            kept.mt = mt, kept.nt = nt;
        }
#endif
        else
            portable_tile(g, m0, mc, n0, nc, (float *)ws);
    }
}

static void gemm16(g16 *g) {
    ag_blas_init();
    double t0 = ag_blas_clock();
    if (g->M > 0 && g->N > 0 && g->K == 0) {
        naive_tile(g, 0, g->M, 0, g->N); // C = beta C
    } else if (g->M > 0 && g->N > 0) {
#if defined(__x86_64__)
        if (g->t == AG_BF16 && ag_cpu_avx512_bf16() && !g->ta && g->tb && g->M <= AG_SKINNY_MAX_M) {
            skinny(g);
            ag_blas_account(t0, 1, 2.0 * (double)g->M * (double)g->N * (double)g->K);
            return;
        }
#endif
        // Columns split finer when the tiles would leave threads idle.
        int64_t threads = ag_num_threads();
        g->mtiles = (g->M + AG_GEMM16_MC - 1) / AG_GEMM16_MC;
        g->nc = AG_GEMM16_NC;
        int64_t want = (2 * threads + g->mtiles - 1) / g->mtiles;
        if ((g->N + g->nc - 1) / g->nc < want) {
            int64_t nc = (g->N + want - 1) / want;
            g->nc = (nc + NR - 1) / NR * NR;
        }
        g->ntiles = (g->N + g->nc - 1) / g->nc;
        // The larger operand's tile is the one that neighbouring tasks (and threads) share, so it
        // is read from memory once (a linear's forward against a vocabulary-sized weight).
        g->n_major = g->N > g->M;
        static atomic_uint_fast64_t calls;
        g->call = atomic_fetch_add(&calls, 1) + 1;
        double tile_flops = 2.0 * AG_GEMM16_MC * (double)g->nc * (double)g->K;
        ag_parallel_for(g->mtiles * g->ntiles, tile_flops > 4e6 ? 1 : (int64_t)(4e6 / tile_flops) + 1, tile_part, g);
    }
    ag_blas_account(t0, 1, 2.0 * (double)g->M * (double)g->N * (double)g->K);
}

void ag_gemm_16(ag_dtype t, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K, float alpha,
                const void *A, int64_t lda, const void *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    g16 g = {t, ta == CblasTrans, tb == CblasTrans, M, N, K, lda, ldb, ldc, alpha, beta, A, B, C, NULL, 0, 0, 0, false,
             0};
    gemm16(&g);
}

void ag_gemm_16_out(ag_dtype t, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K, float alpha,
                    const void *A, int64_t lda, const void *B, int64_t ldb, float beta, void *C, int64_t ldc) {
    g16 g = {t, ta == CblasTrans, tb == CblasTrans, M, N, K, lda, ldb, ldc, alpha, beta, A, B, NULL, C, 0, 0, 0, false,
             0};
    gemm16(&g);
}

void ag_gemm_16_linear_group(ag_dtype t, int64_t M, int64_t K, const void *x, int n, const void *const w[],
                             const int64_t N[], void *const y[]) {
#if defined(__x86_64__)
    if (n >= 1 && n <= AG_JOBS_MAX && t == AG_BF16 && ag_cpu_avx512_bf16() && M >= 1 && M <= AG_SKINNY_MAX_M) {
        ag_blas_init();
        double t0 = ag_blas_clock(), flops = 0;
        g16 g[AG_JOBS_MAX];
        ag_job jobs[AG_JOBS_MAX];
        for (int i = 0; i < n; i++) {
            g[i] = (g16){t, false, true, M, N[i], K, K, K, N[i], 1.0f, 0.0f, x, w[i], NULL, y[i], 0, 0, 0, false, 0};
            jobs[i] = (ag_job){skinny_part, &g[i], N[i] / SK_NR, ((int64_t)1 << 16) / (SK_NR * K * 2 + 1) + 1};
            flops += 2.0 * (double)M * (double)N[i] * (double)K;
        }
        ag_parallel_jobs(n, jobs);
        for (int i = 0; i < n; i++)
            for (int64_t r = N[i] / SK_NR * SK_NR; r < N[i]; r++) skinny_rows(&g[i], 1, r);
        ag_blas_account(t0, n, flops);
        return;
    }
#endif
    for (int i = 0; i < n; i++)
        ag_gemm_16_out(t, CblasNoTrans, CblasTrans, M, N[i], K, 1.0f, x, K, w[i], K, 0.0f, y[i], N[i]);
}
