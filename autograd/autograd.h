// autograd: tensors of float32, bfloat16, float16, int8 or int4 billed through the profiler, a tape
// of nodes, reverse-mode backward.
//
// Tensors are contiguous and row-major, shapes in PyTorch order (shape[0] outermost). Their data
// is one mp_block (NULL in meta mode: every op then allocates exactly as in a real run and skips
// its kernel). Ops run under a context: when grad mode is on and an input needs a gradient, the
// op appends a node to the tape holding its backward function and the tensors backward needs.
// Gradients of intermediate results live on the nodes (category activation) and are freed as
// soon as they were consumed; gradients of leaves (parameters) accumulate into .grad (category
// gradient). Errors are sticky on the context: an op given a NULL input, or run after an
// error, returns NULL, so model code can run a whole block and check once.
//
// Site labels: an op takes a site prefix ("layers.3.self_attn") and labels its output
// "<prefix>:out", its other allocations "<prefix>:<what>" (":rstd", ":probs", ":lse", ":grad").
// A prefix that already holds a colon ("lm_head:logits") labels the output verbatim, and the
// other allocations use the part before the colon.
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "profiler.h"

#define AG_MAX_DIMS 4
#define AG_MAX_SAVED 8
#define AG_ROPE_MAX_HEAD_DIM 1024

// The one error of the layers above the profiler (autograd, model, optim): a function that can
// fail returns -1 (or NULL) and leaves one line in *err naming what is at fault and what was
// expected. Callers that add context prefix it once; nothing below main prints or exits.
typedef struct {
    char msg[512];
} ag_err;

// printf-style: fill *err (NULL is ignored), truncating to fit. Control characters (a newline
// in a tensor name, an escape in a path) are written as \xNN, so a message is always one line.
void ag_err_set(ag_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// src into dst (len bytes, NUL-terminated) with control characters as \xNN; returns the length.
size_t ag_escape(char *dst, size_t len, const char *src);

// Element types. Every tensor has one; its element size and row conversions come from one table
// (ag_type_traits, as ggml's type_traits). Quantised weights (Q8, Q4) keep integers and scales:
//   AG_Q8: int8, one float32 scale for the whole tensor (symmetric, zero point 0), as PyTorch's
//     quantize_dynamic stores a Linear weight; the scale lives in the tensor, not in its data.
//     The N K bytes are in blocks of 4 rows interleaved 64 bytes at a time (ag_q8_offset in
//     ag_kernels.h), the order the int8 kernel streams them.
//   AG_Q4: int4 in [-8, 7] packed two a byte (element 2i in the low nibble), then one float16
//     scale per `group` elements of a row (the last dimension), in the same block.
//   AG_Q8 with a group (q_group > 0): LLM.int8's layout, one float32 absmax per `group` elements
//     of a row after the int8 values (bitsandbytes' SCB: w = q x absmax / 127).
//   AG_NF4: bitsandbytes' NF4 with double quantisation, its whole QuantState in the block
//     (ag_nf4.h's ag_nf4_parts).
typedef enum { AG_F32, AG_BF16, AG_F16, AG_Q8, AG_Q4, AG_NF4, AG_NDTYPES } ag_dtype;

typedef struct {
    const char *name; // "float32", "bfloat16", "float16", "int8", "int4", "nf4"
    int bits;         // of one element (scales not counted)
    bool quantised;   // integers with scales: no row conversions below (see the kernels)
    // n elements of a row to float32 and back (round to nearest even); NULL for quantised types.
    void (*to_f32)(const void *src, float *dst, int64_t n);
    void (*from_f32)(const float *src, void *dst, int64_t n);
} ag_type_traits;

const ag_type_traits *ag_type_traits_of(ag_dtype t); // NULL for a value outside the enum

typedef struct ag_ctx ag_ctx;
typedef struct ag_node ag_node;
typedef struct ag_tensor ag_tensor;

typedef enum {
    AG_OK = 0,
    AG_ERR_ARG,    // NULL input, bad size, id out of range
    AG_ERR_SHAPE,  // shapes that do not fit the op
    AG_ERR_BUDGET, // the profiler refused an allocation past its budget (see mp_oom())
    AG_ERR_NOMEM,  // the allocator failed
    AG_ERR_STATE,  // backward without a graph, profiler not initialised
} ag_status;

struct ag_tensor {
    int ndim;
    int64_t shape[AG_MAX_DIMS];
    int64_t numel;
    void *data;     // block.data, elements of `dtype`; NULL in meta mode
    mp_block block; // owned: freed when refcount reaches 0
    bool requires_grad;
    bool is_param;
    ag_tensor *grad; // leaves only (category gradient, site "<name>:grad"); NULL until backward
    ag_node *node;   // the node that made it, while the tape holds it; NULL for leaves
    int refcount;
    int bits;               // the element size of its dtype (ag_type_traits_of(dtype)->bits)
    ag_dtype dtype;         // what data holds
    float q_scale;          // AG_Q8: the per-tensor scale
    int64_t q_group;        // AG_Q4 (and AG_Q8 with row scales): elements of a row sharing one scale
    int tape_nodes;         // leaves: nodes on the tape with an edge to it
    mp_block grad_wait;     // leaves, PYTORCH semantics: a gradient waiting for the others to be summed
    mp_block grad_new;      // ... and the one just written, summed with it after its node's backward
    uint32_t site;          // interned label (mp_site_name); a parameter's name
    uint64_t storage_bytes; // deferred parameters: what their storage is billed (their dtype when made)
    bool own_bits;          // a parameter of its own dtype: its .grad and optimizer state take it too
    ag_tensor *base;        // a view (ag_part): the tensor whose block holds its data, retained; its own
                            // block is empty
};

// Data and its element type: what kernels take, so that one loop serves every dtype.
typedef struct {
    void *p;
    ag_dtype t;
} ag_buf;
static inline ag_buf ag_buf_of(const ag_tensor *t) { return (ag_buf){t ? t->data : NULL, t ? t->dtype : AG_F32}; }
static inline ag_buf ag_buf_f32(const float *p) { return (ag_buf){(void *)p, AG_F32}; }
// b advanced by off elements (float dtypes).
static inline ag_buf ag_buf_at(ag_buf b, int64_t off) {
    return (ag_buf){b.p ? (char *)b.p + off * (b.t == AG_F32 ? 4 : 2) : NULL, b.t};
}

// Float32 views of typed data, a block of elements at a time: kernels written for float32 read
// and write any dtype through these, the conversions in a stack buffer of AG_BLK floats.
#define AG_BLK 512
// One element of a float dtype as float32, and its store.
static inline float ag_get(const void *p, ag_dtype t, int64_t i) {
    float v;
    if (t == AG_F32) return ((const float *)p)[i];
    ag_type_traits_of(t)->to_f32((const uint16_t *)p + i, &v, 1);
    return v;
}
static inline void ag_set(void *p, ag_dtype t, int64_t i, float v) {
    if (t == AG_F32)
        ((float *)p)[i] = v;
    else
        ag_type_traits_of(t)->from_f32(&v, (uint16_t *)p + i, 1);
}
// Elements [off, off + n) of b as float32: b's own for F32, else widened into buf (n floats).
static inline const float *ag_rd(ag_buf b, int64_t off, int64_t n, float *buf) {
    if (b.t == AG_F32) return (const float *)b.p + off;
    ag_type_traits_of(b.t)->to_f32((const uint16_t *)b.p + off, buf, n);
    return buf;
}
// Where a kernel writes elements [off, off + n): b's own for F32, else buf, narrowed by ag_wr_end.
// ag_rw is the same with buf holding the current values (for accumulation).
static inline float *ag_wr(ag_buf b, int64_t off, float *buf) { return b.t == AG_F32 ? (float *)b.p + off : buf; }
static inline float *ag_rw(ag_buf b, int64_t off, int64_t n, float *buf) {
    return b.t == AG_F32 ? (float *)b.p + off : (float *)ag_rd(b, off, n, buf);
}
static inline void ag_wr_end(ag_buf b, int64_t off, int64_t n, const float *buf) {
    if (b.t != AG_F32) ag_type_traits_of(b.t)->from_f32(buf, (uint16_t *)b.p + off, n);
}
// dst = src, n elements: a copy, or a cast rounding once when the dtypes differ (on the pool).
void ag_vec_copy(ag_buf dst, ag_buf src, int64_t n);

// The data of a float32 tensor (NULL in meta mode): the typed view callers write and read.
static inline float *ag_f32(const ag_tensor *t) { return (float *)t->data; }

// The data of any tensor from float32 values (numel of them): a copy, a rounding, or a
// quantisation (Q8: its per-tensor scale set; Q4: its group scales written); and back. Nothing
// in meta mode.
void ag_tensor_from_f32(ag_tensor *t, const float *src);
void ag_tensor_to_f32(const ag_tensor *t, float *dst);
// Rows [sr, sr + n) of src, each of its last dimension, as rows [dr, dr + n) of dst (same row
// length): a copy, a cast, or a dequantisation of Q8 and Q4 rows.
void ag_tensor_rows(ag_tensor *dst, int64_t dr, const ag_tensor *src, int64_t sr, int64_t n);
// Row r (its last dimension) of a tensor of any dtype as float32.
void ag_tensor_row_f32(const ag_tensor *t, int64_t r, float *out);
// The index of the largest of x[0, n): the first of equal ones; a NaN is never greater (so a
// NaN at 0 gives 0); 0 when n < 1.
int64_t ag_argmax(const float *x, int64_t n);
// A hint: the pool's idle threads bring these tensors' data toward the caches, in order, while
// the caller goes on (a decode step's weights, during the ops between its products). It
// replaces the hint before; NULL entries are skipped; results and bill are unchanged.
void ag_prefetch(int n, const ag_tensor *const *t);

// Context: grad mode, the tape, a sticky error.
ag_ctx *ag_ctx_new(void);                       // grad mode on; NULL if out of memory
void ag_ctx_free(ag_ctx *ctx);                  // drops the tape (releasing what it saved)
bool ag_set_grad_enabled(ag_ctx *ctx, bool on); // returns the previous mode
bool ag_is_grad_enabled(const ag_ctx *ctx);
ag_status ag_ctx_status(const ag_ctx *ctx);
const char *ag_ctx_error(const ag_ctx *ctx); // NULL when there was no error
void ag_ctx_clear_error(ag_ctx *ctx);
// A caller's failure inside a function the tape runs (a checkpointed block's recomputation in
// backward; a routing file that lacks a layer in a sparse block), so that the ops after it stop:
// the context's error becomes msg (budget status when the profiler's budget was hit), unless it
// has one already. Returns false.
bool ag_ctx_fail(ag_ctx *ctx, const char *msg);

// Memory semantics: the same math, with what a framework allocates, keeps for backward and frees.
// LEAN is membill's minimal saved sets (what fused kernels keep); PYTORCH is PyTorch's eager ops as
// Hugging Face transformers composes them, on current PyTorch; PYTORCH_113 the same on PyTorch
// 1.13; PYTORCH_20 1.13's row on PyTorch 2.0; PYTORCH_20_QWEN that row with Qwen (v1)'s own loss
// (its remote code, modeling_qwen.py, makes it, not transformers'). Each is one row of fields (framework.c): every
// decision a framework makes is a field, and ops, the model, the closed form, the optimizer and the command read the row, never the name.
typedef enum {
    AG_FRAMEWORK_LEAN,
    AG_FRAMEWORK_PYTORCH,
    AG_FRAMEWORK_PYTORCH_113,
    AG_FRAMEWORK_PYTORCH_20,
    AG_FRAMEWORK_PYTORCH_20_QWEN
} ag_framework;
#define AG_NFRAMEWORKS 5

// What RMSNorm keeps for backward: x and a float32 rstd a row (a fused norm); HF: also x * rstd
// (the weight's mul) and w * x (the next linear's input), and x.to(float32) in a 16-bit model;
// HF_SQUARES: also x² (PyTorch 1.13's MeanBackward1 keeps its input).
typedef enum { AG_RMSNORM_X_RSTD, AG_RMSNORM_HF, AG_RMSNORM_HF_SQUARES } ag_rmsnorm_saves;
// Eager attention: one fused op keeping q, k, v and the probabilities (FUSED), or transformers'
// eager_attention_forward op by op (HF_EAGER): the scores made three times (matmul, * scaling,
// + mask), the float32 probabilities kept with the 8-byte scaling scalar, q kept as it is (a
// contiguous copy when batch > 1), the context through bmm and transpose(1, 2).contiguous().
typedef enum { AG_ATTENTION_OPS_FUSED, AG_ATTENTION_OPS_HF_EAGER } ag_attention_ops;
// k and v as HF_EAGER's products take them: READ, the key-value heads in place (the fused op's
// way); REPEAT_KV, transformers' repeat_kv: copies repeated to every query head when the heads are
// grouped, the heads themselves when each serves one query head (no grouping: repeat_kv returns
// its input) or when there is one key-value head (expand + reshape of a size-1 dimension is a
// view, stride 0), the score and context matmuls then making their own contiguous copies when
// they cannot view them as a batch of matrices (batch > 1).
typedef enum { AG_KV_READ, AG_KV_REPEAT_KV } ag_kv_heads;
// Flash attention: the op's own output kept (FUSED), or SDPA's [B, heads, T, D] output kept beside
// transformers' transposed copy, its operands cast under autocast (SDPA).
typedef enum { AG_FLASH_FUSED, AG_FLASH_SDPA } ag_flash_ops;
// The loss: logits and a float32 log-sum-exp a row (FUSED), or transformers' ForCausalLMLoss
// (HF): a float32 log_softmax of every row, the padded int64 labels, nll_loss's total_weight,
// and the dense gradients of nll_loss and log_softmax in backward; or SHIFTED, Qwen (v1)'s
// modeling_qwen.py (QWenLMHeadModel.forward): CrossEntropyLoss on lm_logits[..., :-1, :].contiguous()
// in the logits' own dtype (no upcast; autocast's float32 cast where it runs), SliceBackward's
// zeros of the whole logits in backward.
typedef enum { AG_LOSS_FUSED, AG_LOSS_HF, AG_LOSS_SHIFTED } ag_loss_ops;
// The causal mask the model makes: none (the attention applies the pattern), transformers 4.4x's
// [T, T + 1] (target length T + 1 without an attention mask), or current transformers' [B, 1, T, T]
// (a second one for Qwen's sliding layers).
typedef enum { AG_MASK_NONE, AG_MASK_T_T1, AG_MASK_B_T_T } ag_mask_shape;
// What a checkpointed layer keeps beside its input, from what its caller hands it (the causal
// mask, the positions, the rotary tables): NONE, the input alone (nothing else is handed over);
// SAVED, transformers 4.4x under torch.utils.checkpoint (reentrant): its tensor arguments saved
// for backward, released once the layer's backward ran, the (cos, sin) tuple kept by the node
// until the graph goes; HELD, current transformers (GradientCheckpointingLayer): every argument
// but the input bound in a partial that the node keeps until the graph goes.
typedef enum { AG_CKPT_ARGS_NONE, AG_CKPT_ARGS_SAVED, AG_CKPT_ARGS_HELD } ag_checkpoint_args_kept;
// torch.get_rng_state()'s bytes (CPUGeneratorImplState, the same in 1.13 and since): what
// preserve_rng_state keeps per checkpointed layer.
#define AG_TORCH_RNG_STATE_BYTES 5056
// A mixture of experts: the router keeping its float32 softmax and one grouped dispatch of the
// experts keeping each routed pair's gate and up outputs (GROUPED), or transformers' sparse block
// op by op (HF_EAGER): softmax, topk and `/=` their sum with topk's int64 indices, the sum and the
// values before it kept; one_hot, nonzero and the eager loop over the experts hit (torch.where's
// indices, the gathered rows, the SwiGLU, the weighting, index_add_), each op keeping what its
// node keeps and its backward allocating what it allocates.
typedef enum { AG_MOE_GROUPED, AG_MOE_HF_EAGER } ag_moe_ops;
// torch.optim's foreach Adam: current PyTorch's (eps added in place, lerp_ for exp_avg), 1.13's
// (eps added out of place: a second list of temporaries; exp_avg by mul_ and add_), or 2.0's (as
// 1.13, and Adam's L2 sum a list of its own instead of into .grad).
typedef enum { AG_FOREACH_CURRENT, AG_FOREACH_113, AG_FOREACH_20 } ag_foreach_kind;
// A fused projection's output (Phi-3's qkv_proj, gate_up_proj) split into its parts: views sharing
// one gradient, the value part copied out so that attention keeps it alone (KERNEL); or transformers'
// slices and chunk (HF): views keeping the whole output alive, each slice's gradient base-sized
// (SliceBackward), the chunk's one (SplitBackward).
typedef enum { AG_FUSED_SPLIT_KERNEL, AG_FUSED_SPLIT_HF } ag_fused_split;

// The fields of a row, in order: X(type, field).
#define AG_FW_FIELDS(X)                                                                                                \
    X(const char *, name)                       /* --framework NAME, run.framework */                                  \
    X(const char *, text)                       /* the report's line */                                                \
    X(const char *, brief)                      /* --framework's help */                                               \
    X(bool, typed_tensors)                      /* each output and gradient has its tensor's dtype */                  \
    X(bool, leaf_sum_out_of_place)              /* a leaf reached twice: gradients summed out of place */              \
    X(ag_rmsnorm_saves, rmsnorm)                /* what RMSNorm keeps */                                               \
    X(ag_attention_ops, attention)              /* eager attention's ops */                                            \
    X(ag_kv_heads, kv_heads)                    /* k and v as the eager products take them */                          \
    X(ag_flash_ops, flash)                      /* flash attention's ops */                                            \
    X(bool, flash_available)                    /* --attention flash runs (1.13 has no SDPA) */                        \
    X(ag_loss_ops, loss)                        /* the loss's ops */                                                   \
    X(bool, dropout_mask)                       /* dropout keeps a one-byte mask */                                    \
    X(bool, dequantize_whole)                   /* a 4-bit base dequantised whole per product */                       \
    X(bool, autocast)                           /* torch.autocast's casts exist */                                     \
    X(bool, kv_cache_cat)                       /* the KV cache grows by torch.cat */                                  \
    X(bool, prefill_last_logits)                /* a prefill makes the last position's logits only */                  \
    X(ag_mask_shape, mask)                      /* the causal mask the model makes */                                  \
    X(bool, rope_tables)                        /* cos and sin made once a forward, kept by RoPE */                    \
    X(bool, output_cache)                       /* the forward's output holds a DynamicCache */                        \
    X(bool, output_holds_hidden)                /* the base model's output holds the last hidden state */              \
    X(ag_checkpoint_args_kept, checkpoint_args) /* what a checkpointed layer keeps beside its input */                 \
    X(bool, checkpoint_rng_state)               /* a CPU RNG state kept per checkpointed layer */                      \
    X(ag_foreach_kind, adam_foreach)            /* torch.optim's foreach Adam */                                       \
    X(bool, zero_grad_first)                    /* zero_grad opens the step (the Trainer's loop) */                    \
    X(ag_moe_ops, moe)                          /* a mixture of experts' router and experts */                         \
    X(bool, node_sum_out_of_place)              /* a node's gradient made apart, summed out of place */                \
    X(ag_fused_split, fused_split)              /* a fused projection's output split into its parts */

typedef enum {
#define AG_FW_FIELD_ID(type, field) AG_FWF_##field,
    AG_FW_FIELDS(AG_FW_FIELD_ID)
#undef AG_FW_FIELD_ID
        AG_FW_NFIELDS
} ag_framework_field;

typedef struct {
#define AG_FW_MEMBER(type, field) type field;
    AG_FW_FIELDS(AG_FW_MEMBER)
#undef AG_FW_MEMBER
} ag_framework_row;

// The row of f (NULL when f is none); the context's (LEAN's for a NULL context).
const ag_framework_row *ag_framework_row_of(ag_framework f);
const ag_framework_row *ag_ctx_framework_row(const ag_ctx *ctx);
// Reads one field of a row: AG_FW(row, rmsnorm). Every read is counted (ag_framework_field_read),
// so that a test can tell a field no code reads.
#define AG_FW(row, field) (ag_framework_mark(AG_FWF_##field), (row)->field)
void ag_framework_mark(ag_framework_field f);
bool ag_framework_field_read(ag_framework_field f); // read through AG_FW since the process began
// What the eager attention's products take for k and v under row r (its kv_heads) at batch B with
// Hq query and Hkv key-value heads: the heads in place, repeat_kv's copies, or the matmuls' own
// copies (both [B, Hq, Tk, D]). The op, the cached attention and the closed form all ask here.
typedef enum { AG_KV_IN_PLACE, AG_KV_REPEATED, AG_KV_MATMUL_COPIES } ag_kv_layout;
ag_kv_layout ag_eager_kv_layout(const ag_framework_row *r, int64_t B, int Hq, int Hkv);
// A field's name and what it decides, and one row's value of it in words (membill help
// frameworks); NULL for a field out of range.
const char *ag_framework_field_name(ag_framework_field f);
const char *ag_framework_field_doc(ag_framework_field f);
const char *ag_framework_field_value(const ag_framework_row *row, ag_framework_field f);

// LEAN by default. Applies to ops recorded afterwards.
void ag_ctx_set_framework(ag_ctx *ctx, ag_framework f);
ag_framework ag_ctx_framework(const ag_ctx *ctx);

// Which attention ag_attention and ag_attention_cached compute: EAGER materialises the T x T
// probabilities; the others are fused kernels (PyTorch's SDPA backends under the PyTorch
// frameworks) that walk key/value tiles with an online softmax and keep a log-sum-exp per query
// row instead: FLASH (FlashAttention-2), EFFICIENT (the memory-efficient kernel), CUDNN (cuDNN's).
// What each keeps is a row of the SDPA kernel table below, by device. EAGER by default.
typedef enum { AG_ATTENTION_EAGER, AG_ATTENTION_FLASH, AG_ATTENTION_EFFICIENT, AG_ATTENTION_CUDNN } ag_attention_kind;
#define AG_NATTENTION 4
void ag_ctx_set_attention(ag_ctx *ctx, ag_attention_kind a);
ag_attention_kind ag_ctx_attention(const ag_ctx *ctx);

// ---- devices and their kernels (sdpa.c) ----
// The device the run's kernels are PyTorch's for. A device is a row: which SDPA kernel each
// --attention names there, and torch.optim's default there; a kernel is a row of what it
// allocates and keeps. Ops read the rows, never the device. A new device or backend is a row.
typedef enum { AG_DEVICE_CPU, AG_DEVICE_CUDA } ag_device;
#define AG_NDEVICES 2

// How a kernel's float32 dQ sums are billed in backward: only for a 16-bit dQ, [B, Tq, Hq, D]
// (DQ_16BIT), or always, its rows rounded up to d_rows_align and D to dq_dim_align
// (FlashAttention-2's dq_accum).
typedef enum { AG_DQ_16BIT, AG_DQ_ALWAYS } ag_dq_accum;

// The fields of an SDPA kernel's row, in order: X(type, field).
#define AG_SDPA_FIELDS(X)                                                                                              \
    X(const char *, name)    /* the kernel, as the report names it */                                                  \
    X(const char *, source)  /* the PyTorch function whose allocations the row follows */                              \
    X(bool, out_heads_first) /* its output laid out [B, H, T, D]: transformers' transpose(1, 2).contiguous()           \
                                copies it */                                                                           \
    X(int, lse_align)        /* the log-sum-exp [B, H, T] float32, T rounded up to a multiple of this */               \
    X(int, rng_bytes)        /* the RNG seed and offset the node keeps on the device, bytes each (0: host) */          \
    X(bool, gqa)             /* k and v taken at their own heads (enable_gqa); false: repeat_kv's copies */            \
    X(int, d_rows_align)     /* backward's float32 rowsum(dO * O) [B, H, T], T rounded up to this */                   \
    X(ag_dq_accum, dq_accum) /* backward's float32 dQ sums */                                                          \
    X(int, dq_dim_align)     /* their head dimension rounded up to this (AG_DQ_ALWAYS) */                              \
    X(bool, dkv_expanded)    /* grouped heads: dK and dV made at every query head, then summed */

typedef struct {
#define AG_SDPA_MEMBER(type, field) type field;
    AG_SDPA_FIELDS(AG_SDPA_MEMBER)
#undef AG_SDPA_MEMBER
} ag_sdpa_kernel;

typedef enum {
#define AG_SDPA_FIELD_ID(type, field) AG_SDPAF_##field,
    AG_SDPA_FIELDS(AG_SDPA_FIELD_ID)
#undef AG_SDPA_FIELD_ID
        AG_SDPA_NFIELDS
} ag_sdpa_field;

typedef struct {
    const char *name; // --device NAME
    const char *text; // the report's line
    // PyTorch's kernel behind each --attention on this device (NULL: none there; eager is no SDPA
    // kernel). Frameworks whose flash is not SDPA (lean) use ag_sdpa_fused whatever the device.
    const ag_sdpa_kernel *sdpa[AG_NATTENTION];
    bool adam_foreach; // torch.optim's default Adam is foreach here (for-loop otherwise)
} ag_device_row;

const ag_device_row *ag_device_row_of(ag_device d); // NULL when d is none
extern const ag_sdpa_kernel ag_sdpa_fused;          // membill's own fused attention (lean)
// Reads one field of a kernel row: AG_SDPA(k, lse_align). Every read is counted, as AG_FW's.
#define AG_SDPA(row, field) (ag_sdpa_mark(AG_SDPAF_##field), (row)->field)
void ag_sdpa_mark(ag_sdpa_field f);
bool ag_sdpa_field_read(ag_sdpa_field f);
const char *ag_sdpa_field_name(ag_sdpa_field f);
const char *ag_sdpa_field_doc(ag_sdpa_field f);
// The kernels a device row names, each once (n of them into out, at most max); the fused one last.
int ag_sdpa_kernels(const ag_sdpa_kernel **out, int max);

// CPU by default. Applies to ops recorded afterwards.
void ag_ctx_set_device(ag_ctx *ctx, ag_device d);
ag_device ag_ctx_device(const ag_ctx *ctx);
// The kernel the context's attention runs: NULL for eager, and for a fused attention the device
// does not have (the op then fails, naming it).
const ag_sdpa_kernel *ag_ctx_sdpa(const ag_ctx *ctx);

// The precision policy: which dtype each category and op output gets, the one place a real run
// and a meta run both take it from. Categories: weight at weight_bits (matrices under 16 bits are
// Q8 or Q4: Q4 adds one float16 scale (scale_bytes 2) per `group` elements of a row; vectors such
// as norm weights stay at act_bits); gradient at grad_bits; activation and cache at act_bits,
// except the statistics autocast keeps in float32 whatever the compute dtype: RMSNorm's ":rstd"
// and cross-entropy's ":lse" (4 bytes). 16 bits are bfloat16, or float16 when fp16.
typedef struct {
    int act_bits;    // activations, gradients of non-parameters, KV cache: 32 or 16
    int weight_bits; // parameters: 32, 16, 8 or 4
    int grad_bits;   // .grad of parameters: 32 or 16
    int64_t group;   // weights under 16 bits: elements of a row sharing one scale; 0: no scales
    int scale_bytes; // bytes of one scale (2: fp16)
    // torch.autocast(bfloat16) over float32 parameters (PYTORCH semantics only): each matmul casts
    // its float32 operands to 16 bits (the casts of weights and inputs kept for backward) and
    // returns 16 bits; other ops follow PyTorch's type promotion from their inputs.
    bool autocast;
    bool fp16; // 16 bits are float16, not bfloat16
    // Weight matrices as bitsandbytes' NF4 with double quantisation (weight_bits 4, group 0):
    // billed at that layout's exact bytes per tensor (ag_nf4.h); vectors as above.
    bool nf4;
} ag_precision;

// The bytes bitsandbytes holds for an NF4 tensor of n elements (ag_nf4.h's layout): 4-bit
// values, an 8-bit absmax per 64, a float32 absmax per 64 x 256, the offset and the code tables.
uint64_t ag_nf4_bytes(uint64_t n);

// Every size float32 (the default of a new context).
ag_precision ag_precision_f32(void);
// False with the context's error set for sizes not listed above. Applies to allocations made
// afterwards. Real runs compute every setting; a quantised weight gets no gradient of its own (a
// frozen base: the gradient of its input is computed through it, the weight dequantised in the
// compute dtype).
bool ag_ctx_set_precision(ag_ctx *ctx, const ag_precision *d);
ag_precision ag_ctx_precision(const ag_ctx *ctx);
// The bytes a tensor of this shape, category and label is billed under the context's dtype.
uint64_t ag_billed_bytes(const ag_ctx *ctx, int ndim, const int64_t *shape, mp_category cat, const char *label);

// Tensors. New tensors hold one reference, owned by the caller; data is left uninitialised.
ag_tensor *ag_tensor_new(ag_ctx *ctx, int ndim, const int64_t *shape, mp_category cat, const char *site);
// A tensor billed at `bits` an element whatever its category (a float32 copy in a 16-bit model,
// FSDP's float32 gradient shards beside 16-bit parameters).
ag_tensor *ag_tensor_new_bits(ag_ctx *ctx, int ndim, const int64_t *shape, mp_category cat, const char *site, int bits);
// A parameter: category weight, requires_grad, is_param, labelled with its name.
ag_tensor *ag_param_new(ag_ctx *ctx, int ndim, const int64_t *shape, const char *name);
// A parameter of its own float dtype (bits 32 or 16), whatever the context's (PEFT's float32
// adapters beside a 16-bit base): its .grad and its optimizer state are of that dtype too, as
// PyTorch makes a gradient and torch.optim its state like the parameter.
ag_tensor *ag_param_new_bits(ag_ctx *ctx, int ndim, const int64_t *shape, const char *name, int bits);
ag_tensor *ag_retain(ag_tensor *t);  // returns t
void ag_release(ag_tensor *t);       // NULL is a no-op; a parameter's .grad goes with it
void ag_zero_grad(ag_tensor *param); // frees .grad (set to none, as PyTorch)
const char *ag_tensor_name(const ag_tensor *t);

// Hooks on the parameters (leaves) of a backward, as data-parallel engines hang theirs (PyTorch
// DDP's post-accumulate-grad hooks, DeepSpeed ZeRO-3's pre-backward fetch): before_backward(leaf)
// runs before each node that reaches the leaf runs its backward (so that a sharded parameter's
// data can be gathered for it), and before each node that keeps a frozen parameter (no
// requires_grad) for its backward; grad_ready(leaf) once the leaf's .grad is final for this backward
// (every node reaching it ran and was freed). Either may be NULL. A hook that returns false stops
// the backward with its message (the rest of the tape is dropped, as on any error). Neither runs
// for nodes skipped after an error, nor for ag_tape_clear.
typedef struct {
    bool (*before_backward)(void *user, ag_tensor *leaf, ag_err *err);
    bool (*grad_ready)(void *user, ag_tensor *leaf, ag_err *err);
    void *user;
} ag_leaf_hooks;
void ag_ctx_set_leaf_hooks(ag_ctx *ctx, const ag_leaf_hooks *hooks); // NULL: none

// Parameters without storage, as torch's meta-device construction and DeepSpeed's zero.Init:
// with defer on, ag_param_new bills and allocates nothing (data NULL, block empty), and the
// caller gives each parameter its storage when it needs the data. ag_param_alloc_storage
// allocates it (billed weight at the context's dtype, under the parameter's name; contents
// undefined), false with the context's error set; ag_param_free_storage frees it (the tensor,
// its shape and its .grad stay). ag_param_has_storage: in meta mode too (a block without data).
// A deferred parameter keeps the dtype and billing of the context's dtype when it was made (a
// quantised frozen base made under its own precision stays quantised); ag_param_storage_bytes
// is what its storage takes, with or without it.
void ag_ctx_defer_params(ag_ctx *ctx, bool defer);
bool ag_param_alloc_storage(ag_ctx *ctx, ag_tensor *param);
void ag_param_free_storage(ag_tensor *param);
bool ag_param_has_storage(const ag_tensor *param);
uint64_t ag_param_storage_bytes(const ag_tensor *param);

// Backward. ag_backward seeds d(loss) = 1 (loss must hold one element); ag_backward_grad seeds
// d(out) = grad (same number of elements). Both run the tape in reverse, release each node's
// saved tensors and gradient right after its backward ran, and leave the tape empty: tensors
// made by recorded ops then no longer require grad.
ag_status ag_backward(ag_ctx *ctx, ag_tensor *loss);
ag_status ag_backward_grad(ag_ctx *ctx, ag_tensor *out, const ag_tensor *grad);
// Drops the tape without backward, and what a backward's nodes left held for the graph's life
// (ag_checkpoint_with): the loss, and the graph with it, goes.
void ag_tape_clear(ag_ctx *ctx);

// What the tape holds. saved_bytes counts the activation tensors a node keeps alive for its
// backward (parameters it refers to are not counted: they live anyway).
typedef struct {
    const char *op;   // "linear", "attention", ...
    const char *site; // the node's site prefix
    int nsaved;
    const ag_tensor *saved[AG_MAX_SAVED]; // a view's base in its place (the tensor whose block it keeps)
    uint64_t saved_bytes;
} ag_node_info;
size_t ag_tape_size(const ag_ctx *ctx);
bool ag_tape_node(const ag_ctx *ctx, size_t i, ag_node_info *info);
// Activation bytes saved by the whole tape, each tensor counted once however many nodes share it.
uint64_t ag_tape_saved_bytes(const ag_ctx *ctx);

// Ops: output first, then inputs, then sizes. Each returns a new tensor (owned by the caller)
// or NULL with the context's error set.

// y[..., out] = x[..., in] · w[out, in]ᵀ + b[out] (nn.Linear); b NULL: no bias. The bias's
// gradient needs nothing saved: it is the column sums of d(y).
ag_tensor *ag_linear(ag_ctx *ctx, const char *site, ag_tensor *x, ag_tensor *w, ag_tensor *b);
// n linears of one input (1 <= n <= 8): out[i] = ag_linear(ctx, sites[i], x, w[i], b[i]) (b[i] NULL: no
// bias), with the same bills, in the same order. In a real run with nothing to record (grad mode
// off, or no input wanting a gradient) and few rows (a decode step's q, k and v; gate and up),
// weights of one element type run their products in one loop of the pool, each output as
// ag_linear gives it, bit for bit. On failure every out[i] is NULL and the error is set.
bool ag_linear_group(ag_ctx *ctx, int n, const char *const sites[], ag_tensor *x, ag_tensor *const w[],
                     ag_tensor *const b[], ag_tensor *out[]);
// A fused projection (Phi-3's qkv_proj, gate_up_proj): y = x · wᵀ, w's rows in nparts blocks of
// rows[p] (summing to w's rows), y laid out part after part (part p a contiguous [M, rows[p]]), so
// that ag_part views each; billed, saved and typed as ag_linear's y (no bias, no quantised or
// autocast weight: refused).
ag_tensor *ag_linear_parts(ag_ctx *ctx, const char *site, ag_tensor *x, ag_tensor *w, int nparts,
                           const int64_t *rows);
// How ag_part takes its elements: VIEW, a view of the base (no block of its own; the base lives as
// long as it does), its gradient written into the base's; SLICE, the same view with PyTorch's
// SliceBackward (a base-sized gradient of its own, zeros but its part, summed into the base's by
// the engine); COPY, its own block (a fused kernel writing its outputs apart).
typedef enum { AG_PART_VIEW, AG_PART_SLICE, AG_PART_COPY } ag_part_kind;
// The base's elements [offset, offset + numel of shape) as a tensor of that shape.
ag_tensor *ag_part(ag_ctx *ctx, const char *site, ag_tensor *base, int64_t offset, int ndim, const int64_t *shape,
                   ag_part_kind kind);
// y[B, T, H] = table[ids[b*T + t]]; ids are copied.
ag_tensor *ag_embedding(ag_ctx *ctx, const char *site, const int32_t *ids, int64_t B, int64_t T, ag_tensor *table);
// The same as nn.Embedding(padding_idx): positions holding padding_idx add nothing to the
// table's gradient (-1: none, as ag_embedding).
ag_tensor *ag_embedding_padded(ag_ctx *ctx, const char *site, const int32_t *ids, int64_t B, int64_t T,
                               ag_tensor *table, int64_t padding_idx);
// y = x * rsqrt(mean(x², last dim) + eps) * w, as HF LlamaRMSNorm; x[..., H], w[H]. A w[D]
// with D dividing H normalises each D-slice on its own (per-head norms: x[..., heads * D]).
ag_tensor *ag_rmsnorm(ag_ctx *ctx, const char *site, ag_tensor *x, ag_tensor *w, float eps);
// The same with the weight applied as offset + w: Gemma's RMSNorm, x * rstd * (1 + w) in float32.
ag_tensor *ag_rmsnorm_offset(ag_ctx *ctx, const char *site, ag_tensor *x, ag_tensor *w, float eps, float offset);
// RoPE's frequencies. The default (inv_freq NULL): inv_freq[i] = 1 / theta^(2i/hd). A scaled
// RoPE (transformers' rope_scaling: linear, llama3, yarn...) hands its own inv_freq[hd/2], which
// must stay alive as long as any op made with it (backward recomputes the angles), and yarn a
// factor on cos and sin (its attention factor; 0 reads as 1).
typedef struct {
    float theta;
    const float *inv_freq;
    float scale;
} ag_rope_freqs;

// Rotary embedding (HF rotate_half) of x[B, T, nh*hd] at positions pos0 .. pos0+T-1.
ag_tensor *ag_rope(ag_ctx *ctx, const char *site, ag_tensor *x, int nh, int hd, float theta, int64_t pos0);
// The same with one position per row: pos[B*T] (copied), e.g. for left-padded batches.
ag_tensor *ag_rope_positions(ag_ctx *ctx, const char *site, ag_tensor *x, int nh, int hd, float theta,
                             const int32_t *pos);
// The two above with any frequencies (ag_rope is ag_rope_f with {theta, NULL, 1}).
ag_tensor *ag_rope_f(ag_ctx *ctx, const char *site, ag_tensor *x, int nh, int hd, const ag_rope_freqs *f, int64_t pos0);
ag_tensor *ag_rope_positions_f(ag_ctx *ctx, const char *site, ag_tensor *x, int nh, int hd, const ag_rope_freqs *f,
                               const int32_t *pos);
// Causal grouped-query attention, scale 1/sqrt(D): q[B, Tq, Hq*D], k and v [B, Tk, Hkv*D],
// Hkv dividing Hq, Tk >= Tq (query i sits at position i + Tk - Tq); returns [B, Tq, Hq*D].
// Eager: the softmax probabilities [B, Hq, Tq, Tk] are materialised (site "<prefix>:probs").
// When the context says AG_ATTENTION_FLASH, this is ag_attention_flash.
ag_tensor *ag_attention(ag_ctx *ctx, const char *site, ag_tensor *q, ag_tensor *k, ag_tensor *v, int Hq, int Hkv,
                        int D);
// The same contract, FlashAttention-2 (op_attention_flash.c): key/value tiles with an online
// softmax, nothing T x T allocated. The node keeps q, k, v, the output and a float32 log-sum-exp
// per query row ("<prefix>:lse", [B, Hq, Tq]); forward and backward each hold a bounded per-thread
// workspace ("<prefix>:flash_workspace") while they run, backward also rowsum(dO ∘ O)
// ("<prefix>:flash_d", [B, Hq, Tq] float32). Under the PyTorch frameworks, transformers' sdpa
// path: SDPA's output [B, Hq, Tq, D] ("<prefix>:sdpa_out") is the one kept, and the op returns
// its transpose(1, 2).contiguous() copy.
ag_tensor *ag_attention_flash(ag_ctx *ctx, const char *site, ag_tensor *q, ag_tensor *k, ag_tensor *v, int Hq, int Hkv,
                              int D);
// Sliding-window attention (Mistral, Qwen2's windowed layers): the same, the query at position p
// seeing only keys j with p - window < j <= p (window 0: every earlier key, as above). Eager and
// flash, forward and backward.
ag_tensor *ag_attention_window(ag_ctx *ctx, const char *site, ag_tensor *q, ag_tensor *k, ag_tensor *v, int Hq, int Hkv,
                               int D, int64_t window);
ag_tensor *ag_attention_flash_window(ag_ctx *ctx, const char *site, ag_tensor *q, ag_tensor *k, ag_tensor *v, int Hq,
                                     int Hkv, int D, int64_t window);
// Attention sinks (gpt_oss's eager_attention_forward): ag_attention_window with sinks[Hq], a
// learned logit per query head that joins each row's softmax denominator and attends to nothing
// (the row's probabilities sum to less than 1). Under the lean framework, eager (the
// probabilities kept, the node keeps q, k, v and them) or flash (the sink joins each row's
// log-sum-exp after the pass, the output scaled by the share left to the keys; the node keeps
// the sinks beside flash's own); forward and backward, the sinks' gradient -Σ p_sink (dO · O)
// over the head's rows. The PyTorch frameworks' op-by-op attention with sinks is refused. sinks
// NULL: ag_attention_window.
ag_tensor *ag_attention_sinks(ag_ctx *ctx, const char *site, ag_tensor *q, ag_tensor *k, ag_tensor *v, int Hq, int Hkv,
                              int D, int64_t window, ag_tensor *sinks);
// DeepSeek-V3's multi-head latent attention: causal attention of q and k [B, T, H*D] and values of
// their own head size, v [B, T, H*Dv] -> [B, T, H*Dv], at the given scale (attention_mla.c). The
// lean framework's eager attention only (one op keeping q, k, v and the probabilities); any
// other framework or attention is refused by name.
ag_tensor *ag_attention_mla(ag_ctx *ctx, const char *site, ag_tensor *q, ag_tensor *k, ag_tensor *v, int H, int D,
                            int Dv, float scale);
// Columns [off, off + width) of each of the nh heads of x[.., nh*stride], contiguous, y[.., nh*width]
// (torch.split then a copy); deinterleave: even columns first, then odd (DeepSeek's interleaved
// RoPE layout made rotate_half's). Backward scatters dy into zeros.
ag_tensor *ag_head_slice(ag_ctx *ctx, const char *site, ag_tensor *x, int nh, int stride, int off, int width,
                         bool deinterleave);
// Each head's a[.., nh*da] columns then b's [.., nh*db] (torch.cat on the last dimension); b may
// hold one head of db that every head reads (expand), its gradient then summed over the heads.
ag_tensor *ag_head_cat(ag_ctx *ctx, const char *site, ag_tensor *a, ag_tensor *b, int nh, int da, int db);
// What else an attention may take (Gemma 2): the window, the scale on Q Kᵀ (0: 1/sqrt(D); Gemma's
// query_pre_attn_scalar^-1/2) and the scores' soft-cap, softcap tanh(S / softcap) before the mask
// and the softmax (0: none). Eager only: LEAN's fused op recomputes a head's scores in backward
// for the cap's derivative (a [Tq, Tk] float32 block, "<prefix>:capped_scores"); transformers'
// eager ops add S / softcap (freed) and tanh's output, kept. Flash refuses a scale or a cap.
typedef struct {
    int64_t window;
    float scale, softcap;
} ag_attention_spec;
ag_tensor *ag_attention_spec_run(ag_ctx *ctx, const char *site, ag_tensor *q, ag_tensor *k, ag_tensor *v, int Hq, int Hkv,
                                 int D, const ag_attention_spec *spec);
// HF's LlamaRotaryEmbedding: cos and sin [1, T, hd] of positions pos0 .. pos0+T-1 (need no
// gradient), made once per forward and shared by every layer's ag_rope_cs. Both are new tensors
// owned by the caller ("<prefix>:cos", "<prefix>:sin"); false with the error set.
bool ag_rope_tables(ag_ctx *ctx, const char *site, int64_t T, int hd, float theta, int64_t pos0, ag_tensor **cos,
                    ag_tensor **sin);
// The same with any frequencies; yarn's scale multiplies both tables, as transformers does.
bool ag_rope_tables_f(ag_ctx *ctx, const char *site, int64_t T, int hd, const ag_rope_freqs *f, int64_t pos0,
                      ag_tensor **cos, ag_tensor **sin);
// HF's apply_rotary_pos_emb of x[B, T, nh*hd]: x * cos + rotate_half(x) * sin, with its
// transients (the two products, -x2 and the cat); the node keeps cos and sin.
ag_tensor *ag_rope_cs(ag_ctx *ctx, const char *site, ag_tensor *x, int nh, int hd, ag_tensor *cos, ag_tensor *sin);
ag_tensor *ag_silu(ag_ctx *ctx, const char *site, ag_tensor *x);
// y = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x³))): PyTorch's gelu(approximate="tanh"); keeps x.
ag_tensor *ag_gelu_tanh(ag_ctx *ctx, const char *site, ag_tensor *x);
// y = c tanh(x / c), c > 0: logit soft-capping (Gemma 2's final logits). LEAN keeps y; the
// PyTorch frameworks bill transformers' x / c (freed at once) and keep tanh's output
// ("<prefix>:tanh").
ag_tensor *ag_softcap(ag_ctx *ctx, const char *site, ag_tensor *x, float c);
// y = x.to(dtype): a copy at `bits` (32 or 16) an element, x itself when it has them already;
// the gradient comes back at x's size. Saves nothing.
ag_tensor *ag_cast(ag_ctx *ctx, const char *site, ag_tensor *x, int bits);
// transformers' repeat_kv: x[B, T, hkv*D] to [B, T, hkv*rep*D], each key-value head copied to the
// rep query heads of its group (a kernel that takes no grouped heads gets these); saves nothing.
ag_tensor *ag_repeat_kv(ag_ctx *ctx, const char *site, ag_tensor *x, int hkv, int rep, int D);
// y = s x (a constant factor: LoRA's alpha / r); saves nothing.
ag_tensor *ag_scale(ag_ctx *ctx, const char *site, ag_tensor *x, float s);
// Training-mode dropout (nn.Dropout(p)): y = x m / (1 - p), element i kept with probability
// 1 - p by a draw that depends on (seed, i) alone, so a recomputation draws the same mask.
// Under the PyTorch frameworks, native_dropout's bill: a one-byte mask per element
// ("<prefix>:mask"), kept for backward when x needs a gradient; LEAN keeps none (backward draws
// it again). 0 <= p < 1.
ag_tensor *ag_dropout(ag_ctx *ctx, const char *site, ag_tensor *x, float p, uint64_t seed);
ag_tensor *ag_mul(ag_ctx *ctx, const char *site, ag_tensor *a, ag_tensor *b); // same shapes
ag_tensor *ag_add(ag_ctx *ctx, const char *site, ag_tensor *a, ag_tensor *b); // same shapes
// Next-token cross-entropy of logits[B, T, V] against ids[B*T]: position t predicts ids[t+1],
// mean over the B*(T-1) positions (HF labels=input_ids). Returns the loss, shape [1].
ag_tensor *ag_cross_entropy(ag_ctx *ctx, const char *site, ag_tensor *logits, const int32_t *ids);

// ================================================================================================
// Mixture of experts (ops/moe_route.c, ops/moe_experts.c, ops/moe_eager.c, ops/moe_aux_loss.c)
//
// A sparse block routes each of its N tokens to k of its E experts: the router's logits give the
// weights (ag_moe_route), and each expert's SwiGLU runs over the tokens routed to it, its output
// scaled by the token's weight and summed into the token's row (ag_moe_experts). A real run
// routes by the logits; meta mode has no logits, so the caller says how many tokens each expert
// gets (the routing assumption), and every bill follows from those counts.
// ================================================================================================

// Where a block's tokens went.
typedef struct {
    int64_t tokens;  // N
    int k, experts;  // top-k of E
    int32_t *expert; // [N * k]: each token's experts, in top-k order; NULL in meta mode
    int64_t *count;  // [E]: the tokens routed to each (they sum to N * k)
} ag_moe_routing;
void ag_moe_routing_free(ag_moe_routing *r); // NULL is ignored; zeroes *r

// DeepSeek-V3's router (DeepseekV3TopkRouter): sigmoid scores s; the choice by s + bias (bias:
// e_score_correction_bias [E], float32, NULL in meta mode), within the topk_group of n_group groups
// whose two best choices sum highest (the other experts' choices 0); the weights s of the chosen,
// divided by their sum (+ 1e-20) when renorm, times scaling. The bias takes no gradient.
typedef struct {
    int n_group, topk_group;
    float scaling;
    const float *bias;
} ag_moe_sigmoid_group;

typedef struct {
    int top_k;
    bool renorm;            // norm_topk_prob: the k weights divided by their sum
    bool topk_first;        // gpt_oss: the k largest logits, then the softmax over those k (lean only)
    const ag_moe_sigmoid_group *group; // deepseek_v3 (lean only); NULL: none
    const int64_t *assumed; // meta mode: the tokens each expert gets ([E], summing to N x k)
} ag_moe_route_opts;

// The routing weights w[N, k] of logits[.., E] (N rows): p = softmax(logits) in float32, the k
// largest of each row (the first of equal ones), divided by their sum when renorm; w has like's
// dtype (transformers' routing_weights.to(hidden_states.dtype)). *r gets the routing (owned by
// the caller: ag_moe_routing_free). The node keeps p (float32); under the PyTorch frameworks also
// topk's int64 indices and, with renorm, the sum and the values before the in-place division.
ag_tensor *ag_moe_route(ag_ctx *ctx, const char *site, ag_tensor *logits, const ag_tensor *like,
                        const ag_moe_route_opts *o, ag_moe_routing *r);

// gpt_oss's clamped SwiGLU: g = min(gate, limit), u = clamp(up, -limit, limit),
// (u + 1) g sigmoid(alpha g).
typedef struct {
    float limit, alpha;
} ag_moe_glu;

// gpt_oss's experts (GptOssExperts): y[.., H] = Σ_j w[t, j] (glu(x_t gate_up[e] + gate_up_bias[e])
// down[e] + down_bias[e]), e the j-th expert of token t; the weights stacked along the experts,
// gate_up [E, H, 2 I] with gate and up interleaved (even columns the gate), down [E, I, H], the
// biases [E, 2 I] and [E, H] (NULL: none). One grouped dispatch (the lean framework; the PyTorch
// frameworks are refused); the node keeps each pair's gate_up output ([N k, 2 I]) and recomputes
// the rest. A stacked weight's gradient covers every expert, zeros for those no token reached.
ag_tensor *ag_moe_experts_stacked(ag_ctx *ctx, const char *site, ag_tensor *x, ag_tensor *w, const ag_moe_routing *r,
                                  ag_tensor *gate_up, ag_tensor *gate_up_bias, ag_tensor *down, ag_tensor *down_bias,
                                  const ag_moe_glu *glu);

// What transformers' eager dispatch does that changes its allocations, per family, and the
// names of its experts' projections (the sites' labels).
typedef struct {
    // mixtral: the experts hit kept as a tensor [hit, 1] through the loop, and each expert's mask
    // slice taken with one of its rows (a copy); qwen2_moe, qwen3_moe: as Python ints (a view)
    bool hit_tensor;
    const char *proj[3]; // gate, up, down: "w1", "w3", "w2" (mixtral) or "gate_proj", "up_proj", "down_proj"
} ag_moe_eager;

// y[.., H] = Σ_j w[t, j] down_e(silu(gate_e(x_t)) * up_e(x_t)), e the j-th expert of token t, for
// x[.., H] (N rows), w[N, k] and the routing r. gate[e] and up[e] are [I, H], down[e] [H, I].
// LEAN: one grouped dispatch, the pairs sorted by expert; the node keeps each pair's gate and up
// outputs ([N k, I] each) and recomputes the rest. Under the PyTorch frameworks: transformers'
// eager loop over the experts that got tokens, op by op (the expert mask [E, k, N] as one_hot
// int64, each expert's torch.where indices, the gathered rows, its SwiGLU, the scaled output and
// index_add_ into zeros), each op billed and kept as PyTorch keeps it.
ag_tensor *ag_moe_experts(ag_ctx *ctx, const char *site, ag_tensor *x, ag_tensor *w, const ag_moe_routing *r,
                          ag_tensor *const *gate, ag_tensor *const *up, ag_tensor *const *down, const ag_moe_eager *hf);

// y[n, C] = the rows of src viewed as [R, C] (C divides src's elements): y[i] = src[rows[i]] (rows
// copied; NULL in meta mode). index (may be NULL) is the int64 tensor holding the rows, kept for
// backward as PyTorch's IndexBackward keeps it. Backward: a zeroed gradient of src's size into
// which the rows' gradients accumulate.
ag_tensor *ag_index_rows(ag_ctx *ctx, const char *site, ag_tensor *src, int64_t C, const int64_t *rows, int64_t n,
                         ag_tensor *index);
// y[n, C] = x[n, C] * s[n, 1] (a weight per row).
ag_tensor *ag_scale_rows(ag_ctx *ctx, const char *site, ag_tensor *x, ag_tensor *s);
// acc[rows[i]] += src[i] in place (index_add_ along dimension 0 of acc[R, C]): the result owns
// acc's storage, and acc (taken over: the caller's reference) must not be used again. index as
// ag_index_rows's.
ag_tensor *ag_index_add(ag_ctx *ctx, const char *site, ag_tensor *acc, const int64_t *rows, int64_t n, ag_tensor *src,
                        ag_tensor *index);
// Expert parallelism's all-to-all as one rank of the group sees it: x[n, C] goes out to the other
// ranks and y[m, C] comes in (their rows for this rank's experts); backward sends y's gradient
// back and receives x's. Meta mode only (a simulated rank: the bill of its buffers).
ag_tensor *ag_all_to_all(ag_ctx *ctx, const char *site, ag_tensor *x, int64_t m);
// y[N, C] = sigmoid(g[N, 1]) * x[N, C] (qwen2_moe's shared expert gate).
ag_tensor *ag_sigmoid_gate(ag_ctx *ctx, const char *site, ag_tensor *g, ag_tensor *x);
// The load-balancing loss of Switch Transformer as transformers computes it
// (load_balancing_loss_func, no attention mask): logits[l] [N, E] of each of the L sparse layers,
// p = softmax over their concatenation, f_e the share of top-k choices that went to expert e,
// loss = E Σ_e f_e mean(p[:, e]). A scalar [1]; its gradient reaches each layer's logits.
ag_tensor *ag_moe_aux_loss(ag_ctx *ctx, const char *site, int layers, ag_tensor *const *logits, int top_k);

// Compute threads: one pool runs every parallel loop and every large sgemm (OpenBLAS itself runs
// single-threaded inside it). Idle threads sleep after a few microseconds, and loops are handed
// out in chunks, so a core lost to another process slows the step by its share and no more.
void ag_set_num_threads(int n);
int ag_num_threads(void);
// Runs fn over [0, n) in chunks of at least grain items on the pool's threads. thread indexes
// per-thread scratch: each thread that takes part gets its own, below min(chunks,
// ag_num_threads()). Small loops, and loops started inside a chunk, run on the calling thread as
// one range (thread 0).
typedef void (*ag_range_fn)(void *arg, int64_t begin, int64_t end, int thread);
void ag_parallel_for(int64_t n, int64_t grain, ag_range_fn fn, void *arg);
// The same with every item its own chunk: tasks of uneven size (attention's causal blocks).
void ag_parallel_tasks(int64_t n, ag_range_fn fn, void *arg);

// Labels: appends s (or v in decimal) at buf + n, cut to fit cap with its NUL as snprintf cuts, and returns
// n plus the whole length of what was asked for: snprintf's result, without its cost on the path
// of every op (a decode step labels hundreds of tensors).
size_t ag_str_put(char *buf, size_t cap, size_t n, const char *s);
size_t ag_str_put_i64(char *buf, size_t cap, size_t n, long long v);

// "[25, 576] float32": a tensor of like's shape at bits an element (16: float16 when fp16, else
// bfloat16), the description the profiler keeps beside an allocation (mp_alloc_described).
void ag_describe_like(char *out, size_t cap, const ag_tensor *like, int bits, bool fp16);

// Time spent in sgemm since the last reset (all ops, forward and backward).
typedef struct {
    uint64_t calls;
    double seconds;
    double flops;
} ag_blas_stats;
ag_blas_stats ag_get_blas_stats(void);
void ag_reset_blas_stats(void);

// The kernels OpenBLAS runs float32 products with (its core name, "SkylakeX") and who chose
// them: "OpenBLAS" (by CPU model), "OPENBLAS_CORETYPE" (the environment), or "CPU features"
// (OpenBLAS fell back to Prescott's for a CPU model it does not know, and was asked again).
// products: what runs the large float32 products, "OpenBLAS", or "AVX-512 tiles" (autograd's own
// packed kernels) on an AVX-512 CPU where OpenBLAS's kernels are not AVX-512 ones (Haswell's,
// named in OPENBLAS_CORETYPE, or a CPU model it does not know).
typedef struct {
    const char *core, *chosen_by, *products;
} ag_blas_core;
ag_blas_core ag_get_blas_core(void);

// ================================================================================================
// Inference: a key-value cache and attention over it (op_attention_cached.c)
//
// No tape here: these calls need grad mode off (ag_set_grad_enabled(ctx, false)) and fail with
// AG_ERR_STATE otherwise. In meta mode they allocate exactly as in a real run and copy nothing.
// ================================================================================================

// The keys and values of one attention layer, held as a list of chunks, one per append, each
// [B, Hkv, t, D] (Hugging Face's layout). Growing it adds a chunk and never copies the ones
// already there, so the requested bytes are 2 x B x Hkv x t x D x 4 per appended t tokens.
typedef struct ag_kv_cache ag_kv_cache;

// An empty cache (the chunk list itself is plain malloc). Chunks are billed to `cat` with the
// labels "<site>:k_cache" and "<site>:v_cache" for MP_CACHE, "<site>:keys" and
// "<site>:values" for any other category (a forward that keeps no cache). NULL on error.
ag_kv_cache *ag_kv_cache_new(ag_ctx *ctx, const char *site, mp_category cat, int64_t B, int Hkv, int D);
// The same with values of their own head size Dv (DeepSeek's expanded cache: keys at nope + rope,
// values at v_head_dim), appended as v [B, t, Hkv*Dv]; read by ag_attention_mla_cached alone. Dv 0:
// keys alone, appended with v NULL (DeepSeek's latent cache, read by ag_attention_mla_latent).
ag_kv_cache *ag_kv_cache_new_dv(ag_ctx *ctx, const char *site, mp_category cat, int64_t B, int Hkv, int D, int Dv);
void ag_kv_cache_free(ag_kv_cache *c); // NULL is ignored; frees every chunk
// Appends the keys and values of t new tokens, k and v [B, t, Hkv*D] (keys after RoPE), as
// one chunk each. The inputs are copied: the caller may release them at once.
bool ag_kv_cache_append(ag_ctx *ctx, ag_kv_cache *c, const ag_tensor *k, const ag_tensor *v);
int64_t ag_kv_cache_tokens(const ag_kv_cache *c);
size_t ag_kv_cache_chunks(const ag_kv_cache *c);
// (B, Hkv, tokens, D): the shape of the keys (and of the values) as one tensor.
void ag_kv_cache_shape(const ag_kv_cache *c, int64_t shape[4]);
// Requested bytes of keys and values together; *usable (if not NULL) gets the size classes.
uint64_t ag_kv_cache_bytes(const ag_kv_cache *c, uint64_t *usable);
// The keys (or the values) gathered into dst[B, Hkv, tokens, D]; false in meta mode.
bool ag_kv_cache_read(const ag_kv_cache *c, bool values, float *dst);

// Grouped-query attention of q[B, Tq, Hq*D] (after RoPE) over every cached token, scale
// 1/sqrt(D); returns [B, Tq, Hq*D]. The Tq queries are the last Tq cached tokens: query i sits
// at position tokens - Tq + i and sees the keys up to it (causal) that key_mask does not hide:
// key_mask[b * mask_ld + j] is 1 for a real token j of row b, 0 for a pad (mask_ld >= tokens;
// NULL: every key real). A query that sees no key gets zeros. The probabilities
// [B, Hq, Tq, tokens] ("<prefix>:probs") are a temporary freed before returning; when the
// context says AG_ATTENTION_FLASH they are never made: an online softmax over key tiles runs in
// one bounded temporary ("<prefix>:flash_workspace").
ag_tensor *ag_attention_cached(ag_ctx *ctx, const char *site, ag_tensor *q, const ag_kv_cache *cache,
                               const int32_t *key_mask, int64_t mask_ld, int Hq);
// The same under a sliding window of `window` cache slots (0: none): query i also hides the keys
// window or more slots before its own (slots, not positions, as transformers' masks count them;
// the pads of a row come first, so between real tokens the two agree).
ag_tensor *ag_attention_cached_window(ag_ctx *ctx, const char *site, ag_tensor *q, const ag_kv_cache *cache,
                                      const int32_t *key_mask, int64_t mask_ld, int Hq, int64_t window);
// The same with gpt_oss's sinks [Hq] (ag_attention_sinks; NULL: none), under the lean framework.
ag_tensor *ag_attention_cached_sinks(ag_ctx *ctx, const char *site, ag_tensor *q, const ag_kv_cache *cache,
                                     const int32_t *key_mask, int64_t mask_ld, int Hq, int64_t window,
                                     const ag_tensor *sinks);
// The same with ag_attention_spec's scale and soft-cap (Gemma 2), eager only; the PyTorch
// frameworks' transients as without (transformers' S / softcap, tanh and * softcap outputs replace
// each other two at a time, as the scaled and masked scores do).
// DeepSeek-V3's latent attention of q[B, Tq, H*D] over a cache of ag_kv_cache_new_dv (H heads,
// keys at D, values at Dv), at the given scale; returns [B, Tq, H*Dv]. Eager under the lean
// framework only (the rest refused by name); the probabilities a temporary, as in
// ag_attention_cached.
ag_tensor *ag_attention_mla_cached(ag_ctx *ctx, const char *site, ag_tensor *q, const ag_kv_cache *cache,
                                   const int32_t *key_mask, int64_t mask_ld, float scale);
// The same over DeepSeek's latent cache (ag_kv_cache_new_dv with one head of kv_lora + rope and
// Dv 0: the normed compressed kv and the rotated k_pe a token), kv_b_proj [H*(nope + v_head),
// kv_lora] absorbed into the query and the output: q_nope [B, Tq, H*nope], q_pe [B, Tq, H*rope]
// (rotated) -> [B, Tq, H*v_head]. Temporaries: the absorbed query and the latent output [B, Tq, H,
// kv_lora] and the probabilities, freed before returning. Eager, lean, a float or 16-bit kv_b.
ag_tensor *ag_attention_mla_latent(ag_ctx *ctx, const char *site, ag_tensor *q_nope, ag_tensor *q_pe,
                                   const ag_kv_cache *cache, ag_tensor *kv_b, int H, int v_head,
                                   const int32_t *key_mask, int64_t mask_ld, float scale);
ag_tensor *ag_attention_cached_spec(ag_ctx *ctx, const char *site, ag_tensor *q, const ag_kv_cache *cache,
                                    const int32_t *key_mask, int64_t mask_ld, int Hq, const ag_attention_spec *spec);

// ================================================================================================
// Activation checkpointing (op_checkpoint.c)
// ================================================================================================

// A block of ordinary ops: builds its output from x, taking ownership of one reference to x
// (the caller's own reference stays with the caller). Called once in forward and once more in
// backward, it must build the same shapes from the same inputs both times.
typedef ag_tensor *(*ag_block_fn)(ag_ctx *ctx, const void *arg, ag_tensor *x);

// y = fn(x) with full recomputation, as torch.utils.checkpoint. Forward runs fn with grad mode
// off: none of the block's activations stay, only x (retained by the checkpoint node, its
// site unchanged). Backward runs fn again on x with grad mode on, on a private part of the
// tape above the nodes still waiting, backpropagates d(y) through it (parameters accumulate
// into .grad as usual, x's gradient goes to x's own producer) and frees that part: the
// recomputed activations are billed as activation while they live, in the backward phase.
// arg (arg_size bytes, may be 0) is copied, so the caller may pass a local struct; what it
// points to (parameters, config) must live until backward. With grad mode off this is fn(x).
// With it on, y requires grad (the block's parameters are not known before backward). fn
// returning NULL in backward fails the backward (with the context's error, else saying so).
ag_tensor *ag_checkpoint(ag_ctx *ctx, const char *site, ag_block_fn fn, const void *arg, size_t arg_size, ag_tensor *x);
// The same for a block that also receives what its caller shares between blocks: tensor
// arguments (the causal mask, the positions) and a tuple (the rotary tables cos and sin), NULL
// where there is none. The context's row (checkpoint_args, checkpoint_rng_state) says what the
// node keeps of them and how long: saved tensors go once the block's backward ran; what the node
// still holds then stays until the graph goes (ag_tape_clear), as a PyTorch node's attributes
// stay while the loss that leads to it lives. A CPU RNG state may be kept beside them.
typedef struct {
    ag_tensor *tensors[2];
    ag_tensor *tuple[2];
} ag_checkpoint_args;
ag_tensor *ag_checkpoint_with(ag_ctx *ctx, const char *site, ag_block_fn fn, const void *arg, size_t arg_size,
                              ag_tensor *x, const ag_checkpoint_args *args);
