// Kernels by element type: 16-bit products with float32 accumulation, int8 dynamic linears as
// PyTorch's quantize_dynamic computes them, int4 weight-only linears. Internal to autograd (the
// ops call them); the element-type table itself is public (ag_type_traits_of in autograd.h).
//
// Every function picks its path at run time: AVX512-BF16 / AVX512-VNNI / AVX-512 kernels where
// the CPU has them, portable code elsewhere (or when a test forces it). Matrices are row-major;
// shapes are given in the comments as [rows, cols].
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "ag_internal.h"

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
