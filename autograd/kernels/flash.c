// The flash kernels: FlashAttention-2's forward over one block of query rows (key tiles with an
// online softmax), the small products its forward and backward tiles run, and how a flash loop
// is split over the pool. The flash attention's op and the cached attention run on them.
#include <math.h>
#include <string.h>

#include "ag_kernels.h"

#define BR AG_FLASH_BR
#define BC AG_FLASH_BC

static bool portable_only;
void ag_flash_force_portable(bool on) { portable_only = on; }
bool ag_flash_fast(void) { return !portable_only && ag_has_avx512(); }

// ---------------------------------------------------------------------------------------------
// Kernels. ag_flash_mm: C[M, N] (+)= alpha Σ_k A(i, k) B[k, n], with A(i, k) = A[i * ars + k * acs] (a
// transposed operand is a pair of strides) and B row-major; acc false overwrites C.

static void mm_portable(int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t ars, int64_t acs,
                        const float *B, int64_t ldb, float *C, int64_t ldc, bool acc) {
    for (int64_t i = 0; i < M; i++) {
        float *c = C + i * ldc;
        if (!acc) memset(c, 0, (size_t)N * sizeof(float));
        for (int64_t k = 0; k < K; k++) {
            float a = alpha * A[i * ars + k * acs];
            const float *b = B + k * ldb;
            for (int64_t n = 0; n < N; n++) c[n] += a * b[n];
        }
    }
}

#if defined(__x86_64__)
#define MR 6 // rows of C held in registers: 6 x 64 columns, 24 accumulators

// R rows (a constant once inlined) by one panel of up to 64 columns.
AG_AVX512_INLINE void mm_rows16(const int R, int64_t K, float alpha, const float *A, int64_t ars, int64_t acs,
                                const float *B, int64_t ldb, float *C, int64_t ldc, const __mmask16 *mk, bool acc) {
    __m512 c[MR][4];
#pragma GCC unroll 6
    for (int r = 0; r < R; r++)
        for (int q = 0; q < 4; q++) c[r][q] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        const float *b = B + k * ldb, *a = A + k * acs;
        __m512 b0 = _mm512_maskz_loadu_ps(mk[0], b), b1 = _mm512_maskz_loadu_ps(mk[1], b + 16),
               b2 = _mm512_maskz_loadu_ps(mk[2], b + 32), b3 = _mm512_maskz_loadu_ps(mk[3], b + 48);
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            __m512 av = _mm512_set1_ps(a[r * ars]);
            c[r][0] = _mm512_fmadd_ps(av, b0, c[r][0]);
            c[r][1] = _mm512_fmadd_ps(av, b1, c[r][1]);
            c[r][2] = _mm512_fmadd_ps(av, b2, c[r][2]);
            c[r][3] = _mm512_fmadd_ps(av, b3, c[r][3]);
        }
    }
    __m512 al = _mm512_set1_ps(alpha);
#pragma GCC unroll 6
    for (int r = 0; r < R; r++)
        for (int q = 0; q < 4; q++) {
            float *cp = C + r * ldc + 16 * q;
            __m512 x = _mm512_mul_ps(al, c[r][q]);
            if (acc) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(mk[q], cp));
            _mm512_mask_storeu_ps(cp, mk[q], x);
        }
}

AG_AVX512 static void mm_avx512(int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t ars, int64_t acs,
                                const float *B, int64_t ldb, float *C, int64_t ldc, bool acc) {
    for (int64_t n0 = 0; n0 < N; n0 += 64) {
        __mmask16 mk[4];
        for (int q = 0; q < 4; q++) mk[q] = ag_lanes16(N - n0 - 16 * q);
        const float *b = B + n0;
        float *c = C + n0;
        int64_t i = 0;
        for (; i + MR <= M; i += MR) mm_rows16(MR, K, alpha, A + i * ars, ars, acs, b, ldb, c + i * ldc, ldc, mk, acc);
        const float *a = A + i * ars;
        c += i * ldc;
        switch (M - i) {
        case 1: mm_rows16(1, K, alpha, a, ars, acs, b, ldb, c, ldc, mk, acc); break;
        case 2: mm_rows16(2, K, alpha, a, ars, acs, b, ldb, c, ldc, mk, acc); break;
        case 3: mm_rows16(3, K, alpha, a, ars, acs, b, ldb, c, ldc, mk, acc); break;
        case 4: mm_rows16(4, K, alpha, a, ars, acs, b, ldb, c, ldc, mk, acc); break;
        case 5: mm_rows16(5, K, alpha, a, ars, acs, b, ldb, c, ldc, mk, acc); break;
        default: break;
        }
    }
}
#endif

void ag_flash_mm(int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t ars, int64_t acs, const float *B,
                 int64_t ldb, float *C, int64_t ldc, bool acc) {
#if defined(__x86_64__)
    if (ag_flash_fast()) {
        mm_avx512(M, N, K, alpha, A, ars, acs, B, ldb, C, ldc, acc);
        return;
    }
#endif
    mm_portable(M, N, K, alpha, A, ars, acs, B, ldb, C, ldc, acc);
}

// ---------------------------------------------------------------------------------------------
// The forward over one block of query rows (also the cached attention's, ops/attention_cached.c).
// Scores are held transposed, st[c * BR + r] for key c and query r, so that the online softmax
// runs along the keys with the query rows in the vector lanes.

size_t ag_flash_rows_floats(int D) { return 2 * (size_t)D * BR + (size_t)BC * BR + 3 * (size_t)BR; }

void ag_flash_rows_begin(ag_flash_rows *w, float *ws, const float *q, int64_t ldq, int64_t nr, int D) {
    w->D = D;
    w->nr = nr;
    w->scale = 1.0f / sqrtf((float)D);
    w->q = q, w->ldq = ldq;
    w->qt = ws;
    w->acc = w->qt + (size_t)D * BR;
    w->st = w->acc + (size_t)D * BR;
    w->m = w->st + (size_t)BC * BR;
    w->l = w->m + BR;
    w->corr = w->l + BR;
    w->window = 0;
    for (int64_t r = 0; r < nr; r++) {
        for (int d = 0; d < D; d++) w->qt[(int64_t)d * BR + r] = w->scale * q[r * ldq + d];
        w->m[r] = -INFINITY;
        w->l[r] = 0.0f;
    }
    memset(w->acc, 0, (size_t)(nr * D) * sizeof(float));
}

// Few query rows (a decode step): one dot product per (key, query) beats a panel of 16 lanes.
#define FEW_ROWS 8

#if defined(__x86_64__)
AG_AVX512 static void few_scores16(ag_flash_rows *w, const float *k, int64_t ldk, int64_t nk) {
    const int D = w->D;
    for (int64_t c = 0; c < nk; c++)
        for (int64_t r = 0; r < w->nr; r++) {
            __m512 acc = _mm512_setzero_ps();
            for (int d = 0; d < D; d += 16) {
                __mmask16 mk = ag_lanes16(D - d);
                acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, w->q + r * w->ldq + d),
                                      _mm512_maskz_loadu_ps(mk, k + c * ldk + d), acc);
            }
            w->st[c * BR + r] = w->scale * _mm512_reduce_add_ps(acc);
        }
}

// The online softmax update of one tile (scores in st, masked ones -inf): new maxima, the
// correction of the old sums, the probabilities in place of the scores, the new sums.
AG_AVX512 static void online_softmax16(ag_flash_rows *w, int64_t nk) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    for (int64_t r0 = 0; r0 < w->nr; r0 += 16) {
        __mmask16 mk = ag_mask16(w->nr - r0);
        __m512 mx = ninf;
        for (int64_t c = 0; c < nk; c++) mx = _mm512_max_ps(mx, _mm512_maskz_loadu_ps(mk, w->st + c * BR + r0));
        __m512 m_old = _mm512_mask_loadu_ps(ninf, mk, w->m + r0), m_new = _mm512_max_ps(m_old, mx);
        // A row that saw no key yet keeps -inf: its probabilities are 0, not exp(-inf + inf).
        __m512 m_use = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(m_new, ninf, _CMP_NEQ_OQ), m_new);
        __m512 corr = ag_exp16(_mm512_sub_ps(m_old, m_use)), sum = _mm512_setzero_ps();
        for (int64_t c = 0; c < nk; c++) {
            float *sp = w->st + c * BR + r0;
            __m512 s = _mm512_maskz_loadu_ps(mk, sp);
            __m512 p = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(s, ninf, _CMP_NEQ_OQ), ag_exp16(_mm512_sub_ps(s, m_use)));
            _mm512_mask_storeu_ps(sp, mk, p);
            sum = _mm512_add_ps(sum, p);
        }
        __m512 l = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, w->l + r0), corr, sum);
        _mm512_mask_storeu_ps(w->l + r0, mk, l);
        _mm512_mask_storeu_ps(w->m + r0, mk, m_new);
        _mm512_mask_storeu_ps(w->corr + r0, mk, corr);
    }
}
#endif

static void online_softmax_portable(ag_flash_rows *w, int64_t nk) {
    for (int64_t r = 0; r < w->nr; r++) {
        float mx = -INFINITY;
        for (int64_t c = 0; c < nk; c++) mx = fmaxf(mx, w->st[c * BR + r]);
        float m_new = fmaxf(w->m[r], mx), m_use = m_new == -INFINITY ? 0.0f : m_new, sum = 0.0f;
        for (int64_t c = 0; c < nk; c++) {
            float *sp = w->st + c * BR + r;
            *sp = *sp == -INFINITY ? 0.0f : expf(*sp - m_use);
            sum += *sp;
        }
        w->corr[r] = expf(w->m[r] - m_use);
        w->l[r] = w->l[r] * w->corr[r] + sum;
        w->m[r] = m_new;
    }
}

void ag_flash_rows_tile(ag_flash_rows *w, const float *k, int64_t ldk, const float *v, int64_t ldv, int64_t nk,
                        int64_t kpos0, int64_t qpos0, const int32_t *key_mask) {
    const int D = w->D;
    const int64_t nr = w->nr;
#if defined(__x86_64__)
    if (ag_flash_fast() && nr < FEW_ROWS)
        few_scores16(w, k, ldk, nk);
    else
#endif
        ag_flash_mm(nk, nr, D, 1.0f, k, ldk, 1, w->qt, BR, w->st, BR, false);
    // Causal: key c (at kpos0 + c) is hidden from query r (at qpos0 + r) when it comes later.
    for (int64_t c = qpos0 - kpos0 + 1 > 0 ? qpos0 - kpos0 + 1 : 0; c < nk; c++) {
        int64_t hidden = kpos0 + c - qpos0;
        for (int64_t r = 0; r < (hidden < nr ? hidden : nr); r++) w->st[c * BR + r] = -INFINITY;
    }
    // Sliding window: key c is hidden from query r when it lies window or more positions back.
    for (int64_t r = 0; w->window > 0 && r < nr; r++)
        for (int64_t c = 0; c < nk && kpos0 + c < ag_window_first(qpos0 + r, w->window); c++)
            w->st[c * BR + r] = -INFINITY;
    if (key_mask)
        for (int64_t c = 0; c < nk; c++)
            if (!key_mask[c])
                for (int64_t r = 0; r < nr; r++) w->st[c * BR + r] = -INFINITY;
#if defined(__x86_64__)
    if (ag_flash_fast())
        online_softmax16(w, nk);
    else
#endif
        online_softmax_portable(w, nk);
    for (int64_t r = 0; r < nr; r++)
        if (w->corr[r] != 1.0f)
            for (int d = 0; d < D; d++) w->acc[r * D + d] *= w->corr[r];
    ag_flash_mm(nr, D, nk, 1.0f, w->st, 1, BR, v, ldv, w->acc, D, true);
}

void ag_flash_rows_end(ag_flash_rows *w, float *o, int64_t ldo, float *lse) {
    for (int64_t r = 0; r < w->nr; r++) {
        float l = w->l[r], inv = l > 0.0f ? 1.0f / l : 0.0f;
        for (int d = 0; d < w->D; d++) o[r * ldo + d] = w->acc[r * w->D + d] * inv;
        if (lse) lse[r] = l > 0.0f ? w->m[r] + logf(l) : -INFINITY;
    }
}

int ag_flash_threads(int64_t tasks, double macs) {
    if (macs < AG_FLASH_PAR_MIN_MACS || tasks < 2) return 1;
    int n = ag_num_threads();
    return n < 1 ? 1 : (tasks < n ? (int)tasks : n);
}

void ag_run_tasks(int nthreads, int64_t tasks, ag_range_fn fn, void *arg) {
    if (nthreads > 1)
        ag_parallel_tasks(tasks, fn, arg);
    else
        fn(arg, 0, tasks, 0);
}

const float *ag_tile_f32(ag_buf src, int64_t off, int64_t ld, int64_t nr, int D, float *buf) {
    if (src.t == AG_F32) return (const float *)src.p + off;
    for (int64_t r = 0; r < nr; r++) ag_rd(src, off + r * ld, D, buf + r * D);
    return buf;
}
