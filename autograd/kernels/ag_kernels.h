// Kernels shared by the ops and the tape: float32 products (the sgemm door, AVX-512 tiles,
// skinny linears), 16-bit products with float32 accumulation, int8 dynamic linears as PyTorch's
// quantize_dynamic computes them, int4 weight-only linears, the pool, vector loops, softmax rows,
// RoPE's rotation, the causal products and the flash rows. Internal to autograd; the element-type
// table itself is public (ag_type_traits_of in autograd.h).
//
// Every function picks its path at run time: AVX512-BF16 / AVX512-VNNI / AVX-512 kernels where
// the CPU has them, portable code elsewhere (or when a test forces it). Matrices are row-major;
// shapes are given in the comments as [rows, cols].
#pragma once

#include <cblas.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "ag_att.h"
#include "ag_simd.h"
#include "autograd.h"

// ---- scalar conversions (the reference every vector path matches bit for bit) ----

// bfloat16: the top half of a float32, rounded to nearest even; NaN becomes 0x7FC0 (as PyTorch's
// c10::BFloat16 rounds: a NaN's payload is not kept).
static inline uint16_t ag_bf16_from_f32(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
static inline float ag_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
// IEEE half, rounded to nearest even, as the F16C instructions convert (a NaN keeps the top of its
// payload and becomes quiet).
uint16_t ag_f16_from_f32(float f);
float ag_f16_to_f32(uint16_t h);

// Tests: the portable code everywhere (conversions, products, quantised linears) even where the
// CPU has the vector instructions; false restores the run-time choice.
void ag_kernels_force_portable(bool on);
bool ag_has_avx512(void); // the CPU runs AVX-512F code (checked once; not forced off by tests)
// What the CPU offers this process, after ag_kernels_force_portable (each checked once).
bool ag_cpu_avx512(void);      // AVX-512 F, BW, VL (the vector conversions, int4's dequant)
bool ag_cpu_avx512_bf16(void); // vdpbf16ps
bool ag_cpu_avx512_vnni(void); // vpdpbusd
bool ag_cpu_f16c(void);
// vdpbf16ps's multiply-adds a second over float32 FMA's on this CPU (timed once; 0 without it),
// and whether bfloat16 tiles run it (ratio >= AG_BF16_DOT_PAYS) or are widened for sgemm.
#define AG_BF16_DOT_PAYS 0.75
double ag_cpu_bf16_dot_ratio(void);
bool ag_cpu_bf16_dot_pays(void);
// Tests: 1 runs vdpbf16ps tiles wherever the CPU has it, 0 never, -1 restores the timed choice.
void ag_kernels_force_bf16_dot(int on);
// n steps of 12 independent chains of 16-lane FMAs, each in a register: the CPU's peak float32
// multiply-add rate (12 x 16 x n of them; AVX-512F CPUs only). Returns their sum, to be kept.
float ag_fma_chains_avx512(long n);

// ---- 16-bit products ----
//
// C[M, N] = alpha op(A)[M, K] · op(B)[K, N] + beta C, A and B bfloat16 or float16 (t, both the
// same), C float32 (not read when beta is 0), every product accumulated in float32. op(X) is X
// or Xᵀ as CBLAS's transposes; lda and ldb are the stored rows' strides in elements:
//   linear forward  y[T, out] = x[T, in] · w[out, in]ᵀ  (NoTrans, Trans)
//   linear dx       dx[T, in] = dy[T, out] · w[out, in] (NoTrans, NoTrans)
//   linear dw       dw[out, in] = dy[T, out]ᵀ · x[T, in] (Trans, NoTrans)
// Paths: bfloat16 on AVX512-BF16 CPUs runs vdpbf16ps on packed tiles (no float32 copy) where it
// pays (ag_cpu_bf16_dot_pays); with few rows (M <= AG_SKINNY_MAX_M, op(B) = w's rows) it streams
// the weight once without packing. float16, and bfloat16 elsewhere, convert tiles to float32 in
// a per-thread workspace and call single-threaded sgemm on them. Parallel on the pool; timed into
// ag_blas_stats.
// Workspace: AG_GEMM16_WS_BYTES per thread that runs a part (ag_kernel_ws).
void ag_gemm_16(ag_dtype t, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K, float alpha,
                const void *A, int64_t lda, const void *B, int64_t ldb, float beta, float *C, int64_t ldc);
// The same with a 16-bit C of type t: each element rounded once from its float32 value alpha
// op(A) op(B) + beta C (C read as t). Extra workspace: one float32 tile per thread.
void ag_gemm_16_out(ag_dtype t, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K, float alpha,
                    const void *A, int64_t lda, const void *B, int64_t ldb, float beta, void *C, int64_t ldc);
// y[i][M, N[i]] = x[M, K] · w[i][N[i], K]ᵀ in t, for up to AG_JOBS_MAX weights of one x (a linear's
// forward): with bfloat16 and few rows, every product in one loop of the pool; each y[i] as
// ag_gemm_16_out gives it, bit for bit.
void ag_gemm_16_linear_group(ag_dtype t, int64_t M, int64_t K, const void *x, int n, const void *const w[],
                             const int64_t N[], void *const y[]);
// Tile sizes behind the workspace (elements): rows of op(A), columns of op(B), depth. NC is a
// multiple of the kernel's 48 columns, MC of 16 rows, KC of 32.
// The most a kernel keeps on its caller's stack for the rows of a small call (decode).
#define AG_KERNEL_STACK_BYTES 16384

// A weight stream's first bytes into L1, before its loop's own prefetch (running some KB ahead)
// takes over: a thread's chunk of rows otherwise starts cold.
static inline void ag_prefetch_start(const void *p, size_t bytes) {
    for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch((const char *)p + o, 0, 3);
}

#define AG_GEMM16_MC 192
#define AG_GEMM16_NC 288
#define AG_GEMM16_KC 384
#define AG_GEMM16_WS_BYTES                                                                                             \
    ((size_t)(AG_GEMM16_MC + AG_GEMM16_NC) * AG_GEMM16_KC * 4 + (size_t)AG_GEMM16_MC * AG_GEMM16_NC * 4 + 128)

// Scratch of at least `bytes` (64-byte aligned) owned by the calling thread and kept for its next
// call, freed when the thread exits: the kernels' tiles without a malloc and page faults per
// product. NULL when it cannot be had.
void *ag_kernel_ws(size_t bytes);

// ---- int8 dynamic linear (torch.ao.quantization.quantize_dynamic's nn.quantized.dynamic.Linear) ----
//
// Weight: per-tensor symmetric qint8, as MinMaxObserver(qint8, per_tensor_symmetric) observes:
// scale = max|w| / 127.5 in float32, at least float32's epsilon; q = clamp(round-half-even
// (w * (1 / scale)), -128, 127), zero point 0. w is [N, K] (out, in).
void ag_q8_quantize_weight(const float *w, int64_t N, int64_t K, int8_t *q, float *scale);
// The layout the linears read (an AG_Q8 tensor's data): the same N K bytes in blocks of 4 rows
// (the last block the rows left), each block's rows interleaved 64 bytes at a time (the last
// piece of a row the K % 64 left), so that a kernel sweeping a block reads one stream. Element
// (n, k) is at ag_q8_offset(N, K, n, k).
size_t ag_q8_offset(int64_t N, int64_t K, int64_t n, int64_t k);
void ag_q8_quantize_weight_packed(const float *w, int64_t N, int64_t K, int8_t *q, float *scale);
void ag_q8_pack_weight(const int8_t *q, int64_t N, int64_t K, int8_t *packed); // row-major q, into another buffer
void ag_q8_unpack_row(const int8_t *packed, int64_t N, int64_t K, int64_t n, int8_t *row);
// y[M, N] = dequant(quant(x[M, K]) · wq[N, K]ᵀ) + bias (NULL: none), wq packed (above). x is quantised per call to
// quint8 with PyTorch's ChooseQuantizationParams over [min(x, 0), max(x, 0)] and reduce_range
// (levels 0..127, as nn.quantized.dynamic.Linear asks on x86); products accumulate in int32
// exactly, then y = (acc - zp Σ_k wq) (x_scale w_scale) + bias in float32.
// Workspace: M K bytes (the quantised x), malloc'd per call; returns false (nothing written) when
// it cannot be had. The int32 sums hold for K up to 65,793 (2^31 / (255 * 128)), as PyTorch's.
bool ag_q8_linear(const float *x, int64_t M, int64_t K, const int8_t *wq, float w_scale, int64_t N, const float *bias,
                  float *y);
// The same for up to AG_JOBS_MAX weights of one input (a decode step's q, k and v): x quantised
// once, every product in one loop of the pool; y[i] as ag_q8_linear would give it, bit for bit.
typedef struct {
    const int8_t *q;
    float scale;
    int64_t N;
    const float *bias;
} ag_q8_weight;
bool ag_q8_linear_group(const float *x, int64_t M, int64_t K, int n, const ag_q8_weight *w, float *const y[]);
// The activation's quantisation parameters alone (what ag_q8_linear uses), and x quantised with
// them: q = clamp(round-half-even(x * (1 / scale) + zp), 0, qmax).
typedef struct {
    float scale;
    int32_t zero_point;
    int32_t qmax; // 127 with reduce_range
} ag_q8_act_params;
ag_q8_act_params ag_q8_choose_act_params(const float *x, int64_t n);
void ag_q8_quantize_act(const float *x, int64_t n, ag_q8_act_params p, uint8_t *q);

// ---- int4 weight-only linear ----
//
// Block layout (AG_Q4 in autograd.h): N K int4 values packed two a byte over the flat [N, K]
// order (element 2i in the low nibble, ceil(N K / 2) bytes), then N ceil(K / group) float16
// scales, row by row. Symmetric per group of `group` elements of a row: s = amax / 7 (rounded to
// float16; 1 when the group is all zero), q = clamp(round-half-even(w / s), -8, 7). amax / 7
// rather than / 8: the largest value of each group comes back exactly (up to the scale's float16
// rounding) where / 8 would clip it at 7 s.
size_t ag_q4_bytes(int64_t N, int64_t K, int64_t group);
void ag_q4_quantize_weight(const float *w, int64_t N, int64_t K, int64_t group, void *block);
// w[N, K] back to float32 (q times its group's scale), rows [n0, n1) into w (n1 - n0 rows of K).
void ag_q4_dequantize_rows(const void *block, int64_t N, int64_t K, int64_t group, int64_t n0, int64_t n1, float *w);
// y[M, N] = x[M, K] · dequant(block)ᵀ + bias (NULL: none). M <= AG_SKINNY_MAX_M on AVX-512 CPUs:
// the packed weight streamed once, dequantised in registers next to the products (needs K and
// group multiples of 32; x copied once, M K floats malloc'd per call); otherwise tiles of
// AG_Q4_TILE_ROWS weight rows dequantised to float32 and multiplied by sgemm (AG_Q4_TILE_ROWS K
// floats a thread, ag_kernel_ws). Returns false (nothing written) when x's copy cannot be had.
#define AG_Q4_TILE_ROWS 64
bool ag_q4_linear(const float *x, int64_t M, int64_t K, const void *block, int64_t group, int64_t N, const float *bias,
                  float *y);
// The same for up to AG_JOBS_MAX weights of one input: on the fast path x is copied once and every
// product runs in one loop of the pool; y[i] as ag_q4_linear would give it, bit for bit.
typedef struct {
    const void *block;
    int64_t group, N;
    const float *bias;
} ag_q4_weight;
bool ag_q4_linear_group(const float *x, int64_t M, int64_t K, int n, const ag_q4_weight *w, float *const y[]);

// ---- float32 products ----

// blas.c: cblas_sgemm, row-major, timed into ag_blas_stats; small products (attention at short
// lengths, up to AG_SMALL_GEMM_MAX multiply-adds) run in blas.c's own loops on AVX-512 machines.
void ag_sgemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
              int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
// sgemm_tiles.c: the same product on AVX-512 packed tiles split over the pool, whatever kernels
// OpenBLAS would pick; false (nothing done) without AVX-512, for an empty product, or when a
// thread's workspace cannot be mapped. ag_sgemm calls it where ag_sgemm_tiles_pays: shapes of
// at least one kernel tile, where OpenBLAS's kernels are not AVX-512 ones (OpenBLAS's AVX-512
// kernels and the tiles run the model's products at the same rate; its AVX2 ones at about half).
bool ag_sgemm_tiles(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K, float alpha,
                    const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
bool ag_sgemm_tiles_pays(int64_t M, int64_t N, int64_t K);
// blas_core.c: OpenBLAS's kernels are not AVX-512 ones on an AVX-512 CPU (ag_blas_core's products).
bool ag_blas_prefers_tiles(void);
// Tests and benchmarks: 1 runs the tiles for every product on AVX-512 CPUs, 0 never (OpenBLAS),
// -1 restores the choice by shape.
void ag_sgemm_tiles_force(int on);
// gemm.c: the same for operands of any float dtype (ag_buf), accumulated in float32 and rounded
// once into C's dtype; false when out of memory for a conversion.
bool ag_gemm_buf(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K, float alpha, ag_buf A,
                 int64_t lda, ag_buf B, int64_t ldb, float beta, ag_buf C, int64_t ldc);
// The small products alone, untimed, so that threads may run them at once: false (nothing done)
// when the product is above AG_SMALL_GEMM_MAX, A is transposed with B, or the CPU lacks
// AVX-512; the caller then uses ag_sgemm.
bool ag_sgemm_small(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K, float alpha,
                    const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
// Kernels for a linear with few rows (tokens): they stream the weight once per pass where
// sgemm would pack it first. Available for 1 <= M <= AG_SKINNY_MAX_M on AVX-512 machines;
// otherwise the caller uses ag_sgemm. Timed into ag_blas_stats as well.
#define AG_SKINNY_MAX_M 64
// Products up to this many multiply-adds (M N K) skip OpenBLAS on AVX-512 machines.
#define AG_SMALL_GEMM_MAX (1 << 17)
bool ag_skinny_available(int64_t M);
// The forward alone also serves mid-size M (a 25-token step, a 128-token one), x taken in blocks
// of rows that stay in a core's L2 while the weight streams past them. Past 128 rows sgemm's
// packed tiles are faster: each weight row meets every row of x from L2 here, and that bounds it
// near 90 GFLOP/s a core where sgemm reaches 110 to 135 (bench_kernels, Emerald Rapids).
#define AG_SKINNY_FWD_MAX_M 128
bool ag_skinny_forward_available(int64_t M);
// y[M, N] = x[M, K] · w[N, K]ᵀ
void ag_skinny_forward(const float *x, const float *w, float *y, int64_t M, int64_t N, int64_t K);
// y[i][M, N[i]] = x · w[i]ᵀ for up to AG_JOBS_MAX weights of one x, in one loop of the pool
// where x fits one pass; each y[i] as ag_skinny_forward gives it, bit for bit.
void ag_skinny_forward_group(const float *x, int64_t M, int64_t K, int n, const float *const w[], const int64_t N[],
                             float *const y[]);
// dx[M, K] (+)= dy[M, N] · w[N, K] and dw[N, K] (+)= dy[M, N]ᵀ · x[M, K] in one sweep over w
// and dw; a fresh destination is overwritten, otherwise accumulated into.
void ag_skinny_backward(const float *dy, const float *x, const float *w, float *dx, float *dw, int64_t M, int64_t N,
                        int64_t K, bool dx_fresh, bool dw_fresh);

// ---- the pool ----

// The least work a chunk of a parallel loop gets (elements): below about 50 us a chunk costs
// more to hand out than it gains. Loops calling expf reach that sooner than plain arithmetic.
#define AG_PAR_GRAIN (1 << 16)
#define AG_PAR_GRAIN_EXP (1 << 13)
// pool.c
void ag_pool_set_threads(int n);
// Up to AG_JOBS_MAX loops (fn over [0, n), each as ag_parallel_for(n, grain, fn, arg) would split
// it) as one loop of the pool: one hand-over to the threads and one wait, where the loops one
// after another would take one each (a decode step's projections of one input).
#define AG_JOBS_MAX 8
typedef struct {
    ag_range_fn fn;
    void *arg;
    int64_t n, grain;
} ag_job;
void ag_parallel_jobs(int njobs, const ag_job *jobs);
// Replaces what idle pool threads bring toward the caches with n regions, in order (the first
// AG_PREFETCH_MAX of them).
#define AG_PREFETCH_MAX 16
void ag_pool_prefetch(int n, const void *const *p, const size_t *bytes);
size_t ag_pool_prefetch_left(void); // bytes of those regions not yet fetched

// ---- OpenBLAS ----

// Before any OpenBLAS call: its kernels chosen, its own threads off (once; every caller).
void ag_blas_init(void);

// Time spent in matrix products, for ag_get_blas_stats: a start time, then the account.
double ag_blas_clock(void);
void ag_blas_account(double t0, int calls, double flops);

// ---- vector loops ----

// vec.c: dst = a + b; dst = a * b (fresh) or dst += a * b; dst (+)= src. Each rounds once to
// dst's dtype (ag_vec_copy is in autograd.h).
void ag_vec_add(ag_buf dst, ag_buf a, ag_buf b, int64_t n);
void ag_vec_mul_into(ag_buf dst, bool fresh, ag_buf a, ag_buf b, int64_t n);
void ag_vec_acc(ag_buf dst, bool fresh, ag_buf src, int64_t n);
// dst[r, :] (+)= x[r, :] s[r] over rows of C: each row times its own factor (a gate, a routing
// weight), in float32.
void ag_rows_scale(ag_buf dst, bool fresh, ag_buf x, ag_buf s, int64_t rows, int64_t C);
// x[r, :] . y[r, :] in float32: the gradient of a row's factor from the row it scaled.
float ag_row_dot(ag_buf x, ag_buf y, int64_t r, int64_t C);
// y[r, :] += b for every row r of y[M, out] (nn.Linear's addmm), rounded once.
void ag_linear_bias_forward(ag_buf y, ag_buf b, int64_t M, int64_t out);
// db[out] (+)= the column sums of dy[M, out], in float32 (a linear's bias gradient).
void ag_linear_bias_backward(ag_buf db, bool fresh, ag_buf dy, int64_t M, int64_t out);
// D elements of type st at src as type dt at dst (a copy, or a cast; not through the pool).
void ag_copy_elems(void *dst, ag_dtype dt, const void *src, ag_dtype st, int64_t D);
// dst[B, H, T, D] = src[B, T, Hs*D], head h reading source head h / (H / Hs): each head's rows
// made contiguous (the KV cache's layout; repeat_kv's copies when H > Hs).
void ag_to_heads(ag_buf dst, ag_buf src, int64_t B, int64_t T, int H, int Hs, int D);

// ---- softmax rows ----

// softmax.c: y[j] = e^(x[j] - mx) where keep[j] (keep NULL: everywhere), else 0 (y may be x);
// returns Σ y in double. 16 lanes with ag_exp16 where AVX-512 is there, expf elsewhere.
double ag_softmax_exp(float *y, const float *x, int64_t n, float mx, const int32_t *keep);
// Σ a b in double (each product of two floats exact there), 16 lanes at a time where it can.
double ag_dot_f64(const float *a, const float *b, int64_t n);
// One row of the softmax backward, ds = p ∘ (dp - Σ p ∘ dp) (ds may be dp).
void ag_softmax_backward_row(float *ds, const float *dp, const float *p, int64_t n);
// logsumexp of one row of V (AVX-512 where the CPU has it).
float ag_row_logsumexp(const float *x, int64_t V);

// ---- RoPE ----

// rope.c: one row of nh heads, y (+)= x cos + rotate_half(x) sign sin, the first half of each
// head's angles from (c0, s0), the second from (c1, s1).
void ag_rope_row(float *y, const float *x, const float *c0, const float *s0, const float *c1, const float *s1, int nh,
                 int hd, float sign, bool accumulate);
// RoPE's frequency of pair i of a head of hd, in float32 as HF forms it (ops/rope.c, ops/rope_cs.c).
static inline float ag_rope_inv_freq(float theta, int i, int hd) {
    return 1.0f / powf(theta, (float)(2 * i) / (float)hd);
}
// Frequency i of f (its own table, else the default from theta), and its scale of cos and sin.
static inline float ag_rope_freq_at(const ag_rope_freqs *f, int i, int hd) {
    return f->inv_freq ? f->inv_freq[i] : ag_rope_inv_freq(f->theta, i, hd);
}
static inline float ag_rope_scale(const ag_rope_freqs *f) { return f->scale > 0.0f ? f->scale : 1.0f; }
// Frequencies that a rope op can take: positive theta, finite positive entries of a table.
bool ag_rope_freqs_ok(const ag_rope_freqs *f, int hd);

// ---- causal attention ----

// causal.c: one head's products, skipping what the causal mask hides (float32 ones in
// blocks of AG_CAUSAL_BLOCK query rows or keys; 16-bit and mixed ones whole). P[Tq, Tk] and
// S[Tq, Tk] are contiguous; P must be 0 where the mask hides it.
#define AG_CAUSAL_BLOCK 256
// S = alpha Q Kᵀ where a query sees the key; the rest of S is left unwritten.
bool ag_causal_scores(const ag_att_dims *a, float alpha, ag_buf q, int64_t ldq, ag_buf k, int64_t ldk, ag_buf s);
// C[Tq, D] = alpha P V + beta C
bool ag_causal_rows(const ag_att_dims *a, float alpha, ag_buf p, ag_buf v, int64_t ldv, float beta, ag_buf c,
                    int64_t ldc);
// C[Tk, D] = alpha Pᵀ Y + beta C, Y [Tq, D]
bool ag_causal_keys(const ag_att_dims *a, float alpha, ag_buf p, ag_buf y, int64_t ldy, float beta, ag_buf c,
                    int64_t ldc);

// ---- flash rows ----

// The forward over one block of at most AG_FLASH_BR query rows, key tiles of at most AG_FLASH_BC
// keys at a time with an online softmax (flash.c; the flash and the cached attention's forward). The workspace is
// ag_flash_rows_floats(D) floats; q rows strided by ldq; query r sits at position qpos0 + r,
// key c of a tile at kpos0 + c; key_mask (NULL: none) hides keys of the tile whose entry is 0.
#define AG_FLASH_BR 64
#define AG_FLASH_BC 64
#define AG_FLASH_PAR_MIN_MACS (1 << 21) // below this many multiply-adds an op runs on one thread
typedef struct {
    int D;
    int64_t nr, ldq;
    float scale;
    const float *q;
    float *qt, *acc, *st, *m, *l, *corr;
    int64_t window; // 0 (as begin leaves it): causal only; else keys window or more back are hidden
} ag_flash_rows;
size_t ag_flash_rows_floats(int D);
void ag_flash_rows_begin(ag_flash_rows *w, float *ws, const float *q, int64_t ldq, int64_t nr, int D);
void ag_flash_rows_tile(ag_flash_rows *w, const float *k, int64_t ldk, const float *v, int64_t ldv, int64_t nk,
                        int64_t kpos0, int64_t qpos0, const int32_t *key_mask);
// o[r * ldo + d] for the block's rows; lse (NULL: not kept) gets m + log(sum) per row.
void ag_flash_rows_end(ag_flash_rows *w, float *o, int64_t ldo, float *lse);
// nr rows of D elements at off (rows strided by ld) as float32: src's own when float32, else
// widened into buf (nr x D, rows of D).
const float *ag_tile_f32(ag_buf src, int64_t off, int64_t ld, int64_t nr, int D, float *buf);
// The threads a flash loop of `tasks` tasks and `macs` multiply-adds uses (its workspace's count).
int ag_flash_threads(int64_t tasks, double macs);
// Tasks on the pool when ag_flash_threads said more than one thread, else here.
void ag_run_tasks(int nthreads, int64_t tasks, ag_range_fn fn, void *arg);
// Tests: the portable loops even where AVX-512 is there.
void ag_flash_force_portable(bool on);
// The vector loops are on (AVX-512, not forced off).
bool ag_flash_fast(void);
// C[M, N] (+)= alpha Σ_k A(i, k) B[k, n], A(i, k) = A[i * ars + k * acs] (a transposed operand is a
// pair of strides), B row-major; acc false overwrites C. The tiles' products, forward and backward.
void ag_flash_mm(int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t ars, int64_t acs, const float *B,
                 int64_t ldb, float *C, int64_t ldc, bool acc);
