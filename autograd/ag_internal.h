// autograd internals shared by the context, the tape, the backward pass and the ops.
#pragma once

#include <cblas.h>
#include <math.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "ag_op_state.h"
#include "autograd.h"

#define AG_MAX_INPUTS 3 // edges a node holds inline; an op with more (the experts of a mixture) gets them on the heap
#define AG_LABEL_MAX 256

// Writes the gradients of the node's inputs from dout, the gradient of its output (its dtype is
// the node's grad_dtype).
typedef void (*ag_backward_fn)(ag_ctx *ctx, ag_node *n, const void *dout);

// What the nodes of one op share (one static instance per op, in its file): it tags the node's
// state, so the generic code knows how many saved tensors to release and what else to free.
typedef struct {
    const char *name; // "linear", ...
    ag_backward_fn backward;
    int nsaved;                       // saved tensors leading its state (AG_NSAVED), NULL ones included
    void (*release)(ag_op_state *st); // frees the host memory the state owns; NULL: none
} ag_op;

typedef enum { AG_EDGE_NONE, AG_EDGE_NODE, AG_EDGE_LEAF } ag_edge_kind;

// Where the gradient of one input goes.
typedef struct {
    ag_edge_kind kind;
    ag_node *node;   // AG_EDGE_NODE: the input's creator, which owns the gradient buffer
    ag_tensor *leaf; // AG_EDGE_LEAF: retained; the gradient accumulates into leaf->grad
} ag_edge;

struct ag_node {
    const ag_op *op; // tags `state`
    uint32_t site;   // the site prefix
    size_t index;    // on the tape
    int ninputs;
    ag_edge *in; // [ninputs]: in_inline, or malloc'd past AG_MAX_INPUTS
    ag_edge in_inline[AG_MAX_INPUTS];
    ag_tensor *out; // weak: cleared when the output tensor is freed
    int64_t numel;  // of the output
    int ndim;       // and its shape, for the description of its gradient's block
    int64_t shape[AG_MAX_DIMS];
    ag_dtype grad_dtype; // of the output's gradient: the output's own under PYTORCH semantics
    mp_block grad;       // gradient of the output; bytes == 0 until a consumer wrote it
    ag_op_state state;   // the member op names; its saved tensors are retained until backward ran
};

struct ag_ctx {
    bool grad_enabled;
    ag_precision dtype; // element sizes billed (meta mode); float32 by default
    ag_framework framework;
    ag_attention_kind attention;
    ag_node **tape;
    size_t ntape, cap;
    ag_status status;
    char msg[256];
    ag_leaf_hooks hooks; // hooks.c: none unless set
    bool defer_params;   // ag_param_new makes parameters without storage
};

// A gradient destination handed to backward code.
typedef struct {
    void *data;     // NULL in meta mode
    ag_dtype dtype; // of data
    bool needed;    // false: the input needs no gradient, skip its computation
    bool fresh;     // just allocated, contents undefined: write with '=' / beta 0, not accumulate
} ag_grad_dst;
static inline ag_buf ag_dst_buf(const ag_grad_dst *d) { return (ag_buf){d->data, d->dtype}; }

// Labels derived from an op's site argument (see autograd.h).
// The prefix is kept shorter than a label, so that every "<prefix>:<suffix>" fits one.
typedef struct {
    char base[AG_LABEL_MAX - 32];
    char out[AG_LABEL_MAX];
} ag_site;

// hooks.c: the context's leaf hooks around node n's backward (none set: nothing). Before it
// runs, for each leaf it reaches; after it was freed, for each leaf whose gradient is final.
bool ag_hooks_before(ag_ctx *ctx, const ag_node *n);
void ag_hooks_after(ag_ctx *ctx, ag_tensor *const *leaves, int n);

// ctx.c
bool ag_fail(ag_ctx *ctx, ag_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
bool ag_check_inputs(ag_ctx *ctx, const char *op, const char *site, int n, ag_tensor *const *ins,
                     const char *const *names);
bool ag_tape_push(ag_ctx *ctx, ag_node *n);
// "[2, 5, 8]" into buf, for error messages.
const char *ag_shape_str(const ag_tensor *t, char buf[64]);
bool ag_same_shape(ag_ctx *ctx, const char *op, const char *site, const ag_tensor *a, const ag_tensor *b);

// tensor.c
// hooks.c: a parameter of that shape and name without storage (ag_ctx_defer_params).
ag_tensor *ag_param_deferred(ag_ctx *ctx, int ndim, const int64_t *shape, const char *name);
ag_tensor *ag_tensor_like(ag_ctx *ctx, const ag_tensor *t, mp_category cat, const char *label);
// bytes: the float32 size of the data; billed at the context's dtype for the category (the
// same size in real runs, which are float32 only).
// A block of `bytes` float32 bytes, billed at the category's dtype in meta mode.
bool ag_alloc_block(ag_ctx *ctx, mp_block *b, size_t bytes, mp_category cat, const char *label);
// A tensor billed at `bits` an element whatever its category (a float32 copy in a 16-bit model).
ag_tensor *ag_tensor_new_bits(ag_ctx *ctx, int ndim, const int64_t *shape, mp_category cat, const char *site, int bits);
static inline int ag_max_bits(int a, int b) { return a > b ? a : b; } // PyTorch's type promotion
// The output of an elementwise op of a and b (a's shape): under PYTORCH semantics at the wider
// of their element sizes, else as ag_tensor_like(a).
ag_tensor *ag_tensor_promoted(ag_ctx *ctx, const ag_tensor *a, const ag_tensor *b, const char *label);
// A block of exactly `bytes`, whatever the dtype (a float64 scalar, int64 labels).
bool ag_alloc_exact(ag_ctx *ctx, mp_block *b, size_t bytes, mp_category cat, const char *label);
// An activation block of that shape at bits an element, described as such (the trace's shape).
bool ag_alloc_shaped(ag_ctx *ctx, mp_block *b, int ndim, const int64_t *shape, int bits, const char *label);
// A tensor billed at float32 whatever the dtype: the statistics PyTorch's autocast keeps in
// float32 (RMSNorm's rstd, the cross-entropy's log-sum-exp).
ag_tensor *ag_tensor_new_f32(ag_ctx *ctx, int ndim, const int64_t *shape, mp_category cat, const char *site);

// site.c
void ag_site_parse(ag_site *s, const char *site);
// "<base>:<suffix>" into buf[AG_LABEL_MAX], cut if longer; returns snprintf's length.
int ag_label(char *buf, const char *base, const char *suffix);

// node.c
bool ag_needs_grad(const ag_ctx *ctx, const ag_tensor *t);
bool ag_any_needs_grad(const ag_ctx *ctx, int n, ag_tensor *const *ins);
// Appends a node making `out` from the inputs, its state zeroed for the op to fill (saved
// tensors retained); NULL with the error set if out of memory.
ag_node *ag_record(ag_ctx *ctx, const ag_op *op, const char *base, ag_tensor *out, int n, ag_tensor *const *ins);
// Whether input i is the node's first edge to its leaf (a leaf counts each node once).
bool ag_first_edge_to(const ag_node *n, int i);
static inline bool ag_wants_grad(const ag_node *n, int i) { return n->in[i].kind != AG_EDGE_NONE; }
void ag_node_free(ag_node *n);

// grad.c
static inline bool ag_is_pytorch(const ag_ctx *ctx) { return ctx->framework != AG_FRAMEWORK_LEAN; }
bool ag_grad_get(ag_ctx *ctx, ag_node *n, int i, ag_grad_dst *dst);
// All inputs at once; inputs sharing one target are resolved so every write accumulates.
bool ag_grad_get_all(ag_ctx *ctx, ag_node *n, ag_grad_dst *dst);
// Hands the node's own gradient buffer over to input i when that input is a node with no
// gradient yet and the same size (identity backward, as add): no copy, no new buffer.
bool ag_grad_pass(ag_node *n, int i);
// A gradient of input i (a node's output) that the op computed in a block of its own (billed as
// the input's gradient, its shape and dtype), handed to the engine as PyTorch's does: it becomes
// the input's gradient when none has arrived yet; otherwise PyTorch 1.13 sums the two out of
// place into a new block, current PyTorch adds it in place; the part is freed either way. An
// input that is not a node's output drops it. false with the error set.
bool ag_grad_hand_over(ag_ctx *ctx, ag_node *n, int i, mp_block *part);

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
// blas.c: OpenBLAS's kernels are not AVX-512 ones on an AVX-512 CPU (ag_blas_core's products).
bool ag_blas_prefers_tiles(void);
// Tests and benchmarks: 1 runs the tiles for every product on AVX-512 CPUs, 0 never (OpenBLAS),
// -1 restores the choice by shape.
void ag_sgemm_tiles_force(int on);
// op_linear.c: db[out] (+)= the column sums of dy[M, out], in float32 (a linear's bias gradient).
void ag_linear_bias_backward(ag_buf db, bool fresh, ag_buf dy, int64_t M, int64_t out);
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
bool ag_has_avx512(void); // the CPU runs AVX-512F code (checked once)
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

// The least work a chunk of a parallel loop gets (elements): below about 50 us a chunk costs
// more to hand out than it gains. Loops calling expf reach that sooner than plain arithmetic.
#define AG_PAR_GRAIN (1 << 16)
#define AG_PAR_GRAIN_EXP (1 << 13)
// op_rope.c: one row of nh heads, y (+)= x cos + rotate_half(x) sign sin, the first half of each
// head's angles from (c0, s0), the second from (c1, s1).
void ag_rope_row(float *y, const float *x, const float *c0, const float *s0, const float *c1, const float *s1, int nh,
                 int hd, float sign, bool accumulate);
// op_attention.c: y[j] = e^(x[j] - mx) where keep[j] (keep NULL: everywhere), else 0 (y may be x);
// returns Σ y in double. 16 lanes with ag_exp16 where AVX-512 is there, expf elsewhere.
double ag_softmax_exp(float *y, const float *x, int64_t n, float mx, const int32_t *keep);
// Σ a b in double (each product of two floats exact there), 16 lanes at a time where it can.
double ag_dot_f64(const float *a, const float *b, int64_t n);
// op_attention.c: one row of the softmax backward, ds = p ∘ (dp - Σ p ∘ dp) (ds may be dp).
void ag_softmax_backward_row(float *ds, const float *dp, const float *p, int64_t n);
// vec.c: dst = a + b; dst = a * b (fresh) or dst += a * b; dst (+)= src. Each rounds once to
// dst's dtype (ag_vec_copy is in autograd.h).
void ag_vec_add(ag_buf dst, ag_buf a, ag_buf b, int64_t n);
void ag_vec_mul_into(ag_buf dst, bool fresh, ag_buf a, ag_buf b, int64_t n);
void ag_vec_acc(ag_buf dst, bool fresh, ag_buf src, int64_t n);

// Row r of a Q8 block with row scales (LLM.int8's layout: absmax per group after the values).
void ag_q8_rows_row_f32(const void *block, int64_t rows, int64_t cols, int64_t group, int64_t r, float *out);
// tensor_dtype.c: the dtype of a float element size (16: float16 when fp16, else bfloat16; 8: int8; 4: int4).
ag_dtype ag_dtype_of_bits(int bits, bool fp16);

// qlinear.c: a linear over a frozen quantised weight (QLoRA's base), the weight dequantised in the
// compute dtype (y's in forward, dy's in backward). Under PYTORCH semantics the whole weight is
// dequantised into one temporary (site "<base>:dequantized"), as bitsandbytes' MatMul4Bit does
// (dequantize_4bit(W).to(x.dtype), in forward and again in backward); under LEAN, 64 rows at a
// time in a kernel's workspace. Meta mode bills the same and computes nothing.
// y = x · wᵀ (+ b): NF4 weights (Q8 and Q4 forwards stay op_linear.c's).
bool ag_qlinear_forward(ag_ctx *ctx, const char *base, ag_tensor *y, const ag_tensor *x, const ag_tensor *w,
                        const ag_tensor *b);
// The backward of a linear node whose saved w is quantised: dx (+)= dy · w and the bias's sum;
// a quantised weight that wants a gradient sets the context's error.
void ag_qlinear_backward(ag_ctx *ctx, ag_node *n, ag_buf dy);
static inline bool ag_is_quantised(const ag_tensor *t) { return t && ag_type_traits_of(t->dtype)->quantised; }

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

// Before any OpenBLAS call: its kernels chosen, its own threads off (once; every caller).
void ag_blas_init(void);

// Time spent in matrix products, for ag_get_blas_stats: a start time, then the account.
double ag_blas_clock(void);
void ag_blas_account(double t0, int calls, double flops);

#if defined(__x86_64__)
#define AG_AVX512 __attribute__((target("avx512f,fma")))
// e^x in 16 lanes, for loops that call expf per element (softmax, silu): libm's expf is a
// scalar call, about five times slower. Cephes' expf: x = n ln2 + r, |r| <= ln2/2, e^r by a
// degree-7 polynomial, then 2^n by scalef, which also gives inf, 0 and the subnormals where
// expf does; NaN stays NaN. Within 2 ulp of expf (relative error < 2.4e-7).
static inline AG_AVX512 __m512 ag_exp16(__m512 x) {
    // Clamped only for r: beyond +-104 the result is inf or 0 whatever r is, and n keeps it so.
    __m512 xc = _mm512_min_ps(_mm512_set1_ps(104.0f), _mm512_max_ps(_mm512_set1_ps(-104.0f), x));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

// Lanes [0, left) of a 16-lane step.
static inline __mmask16 ag_mask16(int64_t left) {
    return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
}

// The same, with none when left <= 0.
static inline __mmask16 ag_lanes16(int64_t left) { return left <= 0 ? 0 : ag_mask16(left); }

#define AG_AVX512_INLINE static inline __attribute__((always_inline)) AG_AVX512

// ag_bf16_from_f32 in 16 lanes: u + 0x7FFF + (bit 16 of u), NaN lanes 0x7FC0.
static inline __attribute__((target("avx512f"))) __m256i ag_bf16_round16(__m512 x) {
    __m512i u = _mm512_castps_si512(x);
    __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)),
                                 _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)));
    r = _mm512_srli_epi32(r, 16);
    __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7FC0));
    return _mm512_cvtepi32_epi16(r);
}

// r[i] holds row i's 16 words; afterwards r[c] holds column c's (a 16 x 16 transpose of 32-bit
// words): pairs, then quads within 128-bit lanes, then the lanes themselves.
AG_AVX512_INLINE void ag_transpose16(__m512i r[16]) {
    __m512i t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    // u[4 g + e], lane L: rows 4g .. 4g+3 at column 4L + e.
    for (int e = 0; e < 4; e++) {
        __m512i v0 = _mm512_shuffle_i32x4(u[e], u[4 + e], 0x88), v1 = _mm512_shuffle_i32x4(u[e], u[4 + e], 0xDD);
        __m512i w0 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0x88),
                w1 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0xDD);
        r[e] = _mm512_shuffle_i32x4(v0, w0, 0x88);
        r[8 + e] = _mm512_shuffle_i32x4(v0, w0, 0xDD);
        r[4 + e] = _mm512_shuffle_i32x4(v1, w1, 0x88);
        r[12 + e] = _mm512_shuffle_i32x4(v1, w1, 0xDD);
    }
}

// One vector of a kernel's result C = alpha acc (+ C when accumulating a later block of K, else
// + beta C; beta 0 does not read C), the 16 lanes of mask m at cp.
AG_AVX512_INLINE __m512 ag_tile_result(__m512 acc, const float *cp, __mmask16 m, float alpha, float beta,
                                       bool accumulate) {
    __m512 r = _mm512_mul_ps(_mm512_set1_ps(alpha), acc);
    if (accumulate) return _mm512_add_ps(r, _mm512_maskz_loadu_ps(m, cp));
    if (beta != 0.0f) r = _mm512_add_ps(r, _mm512_mul_ps(_mm512_set1_ps(beta), _mm512_maskz_loadu_ps(m, cp)));
    return r;
}

// The sums of four vectors at once: 5 additions where four reductions would take 16 (the
// additions share the multiply-add unit that bounds these kernels).
AG_AVX512_INLINE __m128 hsum4(__m512 a, __m512 b, __m512 c, __m512 d) {
    // Per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3], then [a, b, c, d] partial sums.
    __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
    __m512 s = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
    __m256 h =
        _mm256_add_ps(_mm512_castps512_ps256(s), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1)));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}
#endif

// RoPE's frequency of pair i of a head of hd, in float32 as HF forms it (op_rope.c, op_rope_cs.c).
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

// op_attention.c: dst[B, H, T, D] = src[B, T, Hs*D], head h reading source head h / (H / Hs):
// each head's rows made contiguous (the KV cache's layout; repeat_kv's copies when H > Hs).
void ag_to_heads(ag_buf dst, ag_buf src, int64_t B, int64_t T, int H, int Hs, int D);
// D elements of type st at src as type dt at dst (a copy, or a cast; not through the pool).
void ag_copy_elems(void *dst, ag_dtype dt, const void *src, ag_dtype st, int64_t D);

// op_attention_eager.c: ag_attention under PYTORCH semantics (shapes already checked).
ag_tensor *ag_attention_eager(ag_ctx *ctx, const ag_site *s, ag_tensor *q, ag_tensor *k, ag_tensor *v,
                              const ag_att_dims *a, bool rec);

// The first key the query at position p sees: p - window + 1 under a sliding window, else 0.
static inline int64_t ag_window_first(int64_t p, int64_t window) {
    return window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
}

// How many keys query row i (of Tq, at position i + Tk - Tq) sees: keys 0 .. that - 1.
static inline int64_t ag_keys_seen(const ag_att_dims *a, int64_t i) { return i + a->Tk - a->Tq + 1; }

// attention_causal.c: one head's products, skipping what the causal mask hides (float32 ones in
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

// op_attention.c: the shape checks of ag_attention (false with the error set).
bool ag_attention_shapes(ag_ctx *ctx, const char *base, const ag_tensor *q, const ag_tensor *k, const ag_tensor *v,
                         int Hq, int Hkv, int D);
// The inputs and shapes of an attention call checked, its site parsed and its dims made (false
// with the error set): what eager and flash do first.
bool ag_attention_begin(ag_ctx *ctx, const char *site, ag_tensor *q, ag_tensor *k, ag_tensor *v, int Hq, int Hkv, int D,
                        int64_t window, ag_site *s, ag_att_dims *a);

// op_attention_flash.c: ag_attention when the context says FLASH (shapes already checked).
ag_tensor *ag_attention_flash_checked(ag_ctx *ctx, const ag_site *s, ag_tensor *q, ag_tensor *k, ag_tensor *v,
                                      const ag_att_dims *a, bool rec);
// Its forward over one block of at most AG_FLASH_BR query rows, key tiles of at most AG_FLASH_BC
// keys at a time with an online softmax (shared with ag_attention_cached). The workspace is
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

// op_cross_entropy.c: logsumexp of one row of V (AVX-512 where the CPU has it).
float ag_row_logsumexp(const float *x, int64_t V);
// op_cross_entropy_hf.c: ag_cross_entropy under PYTORCH semantics (inputs already checked).
ag_tensor *ag_cross_entropy_hf(ag_ctx *ctx, const ag_site *s, ag_tensor *logits, const int32_t *ids, bool rec);

// Backward of the nodes above `floor` only, newest first, each freed after it ran (the tape
// below stays as it was): how a checkpoint runs its block's private part of the tape.
ag_status ag_run_tape_to(ag_ctx *ctx, size_t floor);
// Frees the nodes above `floor` without running them.
void ag_tape_clear_to(ag_ctx *ctx, size_t floor);
