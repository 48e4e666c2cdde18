// Devices and the SDPA kernels PyTorch runs on them: what each kernel allocates and keeps, one
// field a fact, each from the function named in its row (PyTorch's aten/src/ATen/native/
// transformers/). The attention op reads the rows; a new device or backend is a new row.
#include <stdatomic.h>

#include "ag_internal.h"

// _scaled_dot_product_flash_attention_for_cpu as the pytorch rows have billed it: the output kept
// heads first beside transformers' transposed copy, a float32 dQ for a 16-bit one.
static const ag_sdpa_kernel flash_cpu = {
    .name = "flash (CPU)",
    .source = "_scaled_dot_product_flash_attention_for_cpu",
    .out_heads_first = true,
    .lse_align = 1,
    .rng_bytes = 0,
    .gqa = true,
    .d_rows_align = 1,
    .dq_accum = AG_DQ_16BIT,
    .dq_dim_align = 1,
    .dkv_expanded = false,
};

// FlashAttention-2 (flash_api.cpp's mha_fwd, mha_bwd): out = empty_like(q) with q laid out
// [B, T, H, D] (returned as a transposed view, so transformers' .contiguous() copies nothing),
// softmax_lse [B, H, T] float32; the philox seed and offset are host scalars. Backward: softmax_d
// [B, H, round(T, 128)] and dq_accum [B, round(T, 128), H, round(D, 32)] float32, and with fewer
// key-value heads dk_expanded and dv_expanded [B, Tk, Hq, D], summed into dk and dv.
static const ag_sdpa_kernel flash_cuda = {
    .name = "flash (CUDA, FlashAttention-2)",
    .source = "_scaled_dot_product_flash_attention (flash_api.cpp mha_fwd / mha_bwd)",
    .out_heads_first = false,
    .lse_align = 1,
    .rng_bytes = 0,
    .gqa = true,
    .d_rows_align = 128,
    .dq_accum = AG_DQ_ALWAYS,
    .dq_dim_align = 32,
    .dkv_expanded = true,
};

// The memory-efficient kernel (_efficient_attention_forward / _backward): res [B, M, H, Kv]
// (a transposed view again), logsumexp [B, H, ceil(M / kAlignLSE) * kAlignLSE] float32 with
// kAlignLSE 32; seed and offset host scalars; no grouped heads (sdp_utils: its dense constraints
// take check_batch_size_and_num_heads_dense<false>), so k and v arrive repeated. Backward: delta
// [B, H, M] float32; its workspace (a float32 gQ accumulator for 16-bit tensors) as dQ's float32
// sums.
static const ag_sdpa_kernel efficient_cuda = {
    .name = "efficient (CUDA, memory-efficient)",
    .source = "_scaled_dot_product_efficient_attention (_efficient_attention_forward / _backward)",
    .out_heads_first = false,
    .lse_align = 32,
    .rng_bytes = 0,
    .gqa = false,
    .d_rows_align = 1,
    .dq_accum = AG_DQ_16BIT,
    .dq_dim_align = 1,
    .dkv_expanded = false,
};

// cuDNN's (_scaled_dot_product_cudnn_attention, run_cudnn_sdpa_fprop): o allocated with q's
// layout, softmaxstats [B, H, T, 1] float32, and its dropout seed and offset at::zeros({1}, kLong)
// on the device, kept for backward. Backward: cuDNN's workspace as dQ's float32 sums and the
// rows' statistics.
static const ag_sdpa_kernel cudnn_cuda = {
    .name = "cudnn (CUDA, cuDNN)",
    .source = "_scaled_dot_product_cudnn_attention (run_cudnn_sdpa_fprop / _bprop)",
    .out_heads_first = false,
    .lse_align = 1,
    .rng_bytes = 8,
    .gqa = true,
    .d_rows_align = 1,
    .dq_accum = AG_DQ_16BIT,
    .dq_dim_align = 1,
    .dkv_expanded = false,
};

const ag_sdpa_kernel ag_sdpa_fused = {
    .name = "fused (membill's own)",
    .source = "ag_attention_flash: q, k, v, the output and a log-sum-exp a row",
    .out_heads_first = false,
    .lse_align = 1,
    .rng_bytes = 0,
    .gqa = true,
    .d_rows_align = 1,
    .dq_accum = AG_DQ_16BIT,
    .dq_dim_align = 1,
    .dkv_expanded = false,
};

static const ag_device_row devices[AG_NDEVICES] = {
    [AG_DEVICE_CPU] =
        {
            .name = "cpu",
            .text = "cpu (PyTorch's CPU kernels)",
            .sdpa = {[AG_ATTENTION_FLASH] = &flash_cpu},
            .adam_foreach = false,
        },
    [AG_DEVICE_CUDA] =
        {
            .name = "cuda",
            .text = "cuda (PyTorch's CUDA kernels)",
            .sdpa = {[AG_ATTENTION_FLASH] = &flash_cuda,
                     [AG_ATTENTION_EFFICIENT] = &efficient_cuda,
                     [AG_ATTENTION_CUDNN] = &cudnn_cuda},
            .adam_foreach = true,
        },
};

const ag_device_row *ag_device_row_of(ag_device d) { return (unsigned)d < AG_NDEVICES ? &devices[d] : NULL; }

int ag_sdpa_kernels(const ag_sdpa_kernel **out, int max) {
    int n = 0;
    for (int d = 0; d < AG_NDEVICES; d++)
        for (int a = 0; a < AG_NATTENTION; a++)
            if (devices[d].sdpa[a] && n < max) out[n++] = devices[d].sdpa[a];
    if (n < max) out[n++] = &ag_sdpa_fused;
    return n;
}

// ---- the fields in words, and which code reads ----

static const char *const names[AG_SDPA_NFIELDS] = {
#define AG_SDPA_NAME(type, field) [AG_SDPAF_##field] = #field,
    AG_SDPA_FIELDS(AG_SDPA_NAME)
#undef AG_SDPA_NAME
};

static const char *const docs[AG_SDPA_NFIELDS] = {
    [AG_SDPAF_name] = "the kernel",
    [AG_SDPAF_source] = "the PyTorch function its allocations follow",
    [AG_SDPAF_out_heads_first] = "output [B, H, T, D], copied by transformers' transpose(1, 2).contiguous()",
    [AG_SDPAF_lse_align] = "log-sum-exp [B, H, T] float32, T rounded up to a multiple of",
    [AG_SDPAF_rng_bytes] = "RNG seed and offset kept on the device, bytes each",
    [AG_SDPAF_gqa] = "k and v at their own heads (enable_gqa); else repeat_kv's copies",
    [AG_SDPAF_d_rows_align] = "backward's float32 rowsum(dO * O) [B, H, T], T rounded up to",
    [AG_SDPAF_dq_accum] = "backward's float32 dQ sums: for a 16-bit dQ (0) or always (1)",
    [AG_SDPAF_dq_dim_align] = "their head dimension rounded up to (always)",
    [AG_SDPAF_dkv_expanded] = "grouped heads: dK and dV made at every query head, then summed",
};

const char *ag_sdpa_field_name(ag_sdpa_field f) { return (unsigned)f < AG_SDPA_NFIELDS ? names[f] : NULL; }
const char *ag_sdpa_field_doc(ag_sdpa_field f) { return (unsigned)f < AG_SDPA_NFIELDS ? docs[f] : NULL; }

static atomic_bool read_flags[AG_SDPA_NFIELDS];

void ag_sdpa_mark(ag_sdpa_field f) {
    if ((unsigned)f < AG_SDPA_NFIELDS) atomic_store_explicit(&read_flags[f], true, memory_order_relaxed);
}

bool ag_sdpa_field_read(ag_sdpa_field f) {
    return (unsigned)f < AG_SDPA_NFIELDS && atomic_load_explicit(&read_flags[f], memory_order_relaxed);
}

// ---- the context's ----

void ag_ctx_set_device(ag_ctx *ctx, ag_device d) {
    if (ctx && ag_device_row_of(d)) ctx->dev = ag_device_row_of(d);
}

ag_device ag_ctx_device(const ag_ctx *ctx) { return ctx && ctx->dev ? (ag_device)(ctx->dev - devices) : AG_DEVICE_CPU; }

const ag_sdpa_kernel *ag_ctx_sdpa(const ag_ctx *ctx) {
    if (!ctx || ctx->attention == AG_ATTENTION_EAGER) return NULL;
    if (AG_FW(ctx->fw, flash) != AG_FLASH_SDPA) return &ag_sdpa_fused;
    return (ctx->dev ? ctx->dev : &devices[AG_DEVICE_CPU])->sdpa[ctx->attention];
}
