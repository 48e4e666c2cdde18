// What the ops share among themselves (beside the tape's ag_internal.h and the kernels): the
// attention's checks and its implementations, the PyTorch-semantics loss and the quantised linear.
#pragma once

#include "ag_internal.h"
#include "kernels/ag_kernels.h"

// qlinear.c: a linear over a frozen quantised weight (QLoRA's base), the weight dequantised in the
// compute dtype (y's in forward, dy's in backward). Under PYTORCH semantics the whole weight is
// dequantised into one temporary (site "<base>:dequantized"), as bitsandbytes' MatMul4Bit does
// (dequantize_4bit(W).to(x.dtype), in forward and again in backward); under LEAN, 64 rows at a
// time in a kernel's workspace. Meta mode bills the same and computes nothing.
// y = x · wᵀ (+ b): NF4 weights (Q8 and Q4 forwards stay linear.c's).
bool ag_qlinear_forward(ag_ctx *ctx, const char *base, ag_tensor *y, const ag_tensor *x, const ag_tensor *w,
                        const ag_tensor *b);
// The backward of a linear node whose saved w is quantised: dx (+)= dy · w and the bias's sum;
// a quantised weight that wants a gradient sets the context's error.
void ag_qlinear_backward(ag_ctx *ctx, ag_node *n, ag_buf dy);
static inline bool ag_is_quantised(const ag_tensor *t) { return t && ag_type_traits_of(t->dtype)->quantised; }

// attention.c: the shape checks of ag_attention (false with the error set).
bool ag_attention_shapes(ag_ctx *ctx, const char *base, const ag_tensor *q, const ag_tensor *k, const ag_tensor *v,
                         int Hq, int Hkv, int D);
// The inputs and shapes of an attention call checked, its site parsed and its dims made (false
// with the error set): what eager and flash do first.
bool ag_attention_begin(ag_ctx *ctx, const char *site, ag_tensor *q, ag_tensor *k, ag_tensor *v, int Hq, int Hkv, int D,
                        int64_t window, ag_site *s, ag_att_dims *a);

// attention_eager.c: ag_attention under PYTORCH semantics (shapes already checked).
ag_tensor *ag_attention_eager(ag_ctx *ctx, const ag_site *s, ag_tensor *q, ag_tensor *k, ag_tensor *v,
                              const ag_att_dims *a, bool rec);
// attention_flash.c: ag_attention when the context says FLASH (shapes already checked).
// sinks (gpt_oss's [Hq]; NULL: none) join each row's softmax (the lean framework's semantics).
ag_tensor *ag_attention_flash_checked(ag_ctx *ctx, const ag_site *s, ag_tensor *q, ag_tensor *k, ag_tensor *v,
                                      ag_tensor *sinks, const ag_att_dims *a, bool rec);

// cross_entropy_hf.c: ag_cross_entropy under PYTORCH semantics (inputs already checked).
ag_tensor *ag_cross_entropy_hf(ag_ctx *ctx, const ag_site *s, ag_tensor *logits, const int32_t *ids, bool rec);
// cross_entropy_shifted.c: ag_cross_entropy as Qwen (v1)'s modeling_qwen.py makes it (inputs checked).
ag_tensor *ag_cross_entropy_shifted(ag_ctx *ctx, const ag_site *s, ag_tensor *logits, const int32_t *ids, bool rec);

// kv_cache.c: one layer's cache, read by the cached attention chunk by chunk.
typedef struct {
    mp_block k, v; // [B, Hkv, t, D] each
    int64_t t;
} kv_chunk;

struct ag_kv_cache {
    int64_t B;
    int Hkv, D;
    int Dv;     // the values' head size: D, or DeepSeek's v_head_dim (ag_kv_cache_new_dv)
    ag_dtype t; // the activations' dtype
    mp_category cat;
    char k_label[AG_LABEL_MAX], v_label[AG_LABEL_MAX];
    int64_t tokens; // over all chunks
    kv_chunk *chunks;
    size_t n, cap;
};
// Nothing over the cache records a node: false with the error set in grad mode.
bool ag_kv_no_grad(ag_ctx *ctx, const char *op, const char *base);

// ops/moe_eager.c: ag_moe_experts under the PyTorch frameworks (inputs checked).
ag_tensor *ag_moe_eager_experts(ag_ctx *ctx, const ag_site *s, ag_tensor *x, ag_tensor *w, const ag_moe_routing *r,
                                ag_tensor *const *W[3], const ag_moe_eager *hf);
