// Phi-3's fused projections: qkv_proj and gate_up_proj as one product each, then q, k, v (gate,
// up) as parts of its output, split as the framework's row says (fused_split): transformers'
// slices and chunk (views keeping the whole output while any of them is kept), or a fused
// kernel's (views sharing one gradient, v copied out so that attention keeps it alone).
#include "blocks.h"

// The output's shape with n features last.
static void shape_with(const ag_tensor *h, int64_t n, int64_t *shape) {
    for (int d = 0; d < h->ndim; d++) shape[d] = h->shape[d];
    shape[h->ndim - 1] = n;
}

static bool hf_split(const ag_ctx *ctx) { return AG_FW(ag_ctx_framework_row(ctx), fused_split) == AG_FUSED_SPLIT_HF; }

void llama_fused_qkv(ag_ctx *ctx, const llama_config *c, const llama_layer *L, ag_tensor *h, int64_t i, ag_tensor **q,
                     ag_tensor **k, ag_tensor **v) {
    *q = *k = *v = NULL;
    if (!h) return; // an earlier op failed: the context holds its error
    const int64_t Q = c->heads * c->head_dim, KV = c->kv_heads * c->head_dim, M = h->numel / h->shape[h->ndim - 1];
    const llama_parts parts = {3, {Q, KV, KV}};
    const bool hf = hf_split(ctx);
    char s[96];
    int64_t sq[AG_MAX_DIMS], skv[AG_MAX_DIMS];
    shape_with(h, Q, sq);
    shape_with(h, KV, skv);
    ag_tensor *y = llama_proj_forward_parts(ctx, L, i, LLAMA_PROJ_QKV, h, &parts);
    if (!y) return;
    // qkv[..., :Q], then K, then V: SliceBackward makes each gradient qkv-sized
    *q = ag_part(ctx, llama_site(s, i, "self_attn.q_proj"), y, 0, h->ndim, sq, hf ? AG_PART_SLICE : AG_PART_VIEW);
    *k = ag_part(ctx, llama_site(s, i, "self_attn.k_proj"), y, M * Q, h->ndim, skv, hf ? AG_PART_SLICE : AG_PART_VIEW);
    *v = ag_part(ctx, llama_site(s, i, "self_attn.v_proj"), y, M * (Q + KV), h->ndim, skv,
                 hf ? AG_PART_SLICE : AG_PART_COPY);
    ag_release(y);
}

// Phi3MLP: gate, up = gate_up_proj(h).chunk(2); up * act(gate) (chunk's one SplitBackward).
ag_tensor *llama_fused_glu(ag_ctx *ctx, const llama_config *c, const llama_layer *L, ag_tensor *h, int64_t i) {
    if (!h) return NULL;
    const int64_t I = c->intermediate, M = h->numel / h->shape[h->ndim - 1];
    const int nd = h->ndim;
    const llama_parts parts = {2, {I, I}};
    char s[96];
    int64_t shape[AG_MAX_DIMS];
    shape_with(h, I, shape);
    ag_tensor *y = llama_proj_forward_parts(ctx, L, i, LLAMA_PROJ_GATE_UP, h, &parts);
    ag_release(h);
    ag_tensor *g = y ? ag_part(ctx, llama_site(s, i, "mlp.gate_proj"), y, 0, nd, shape, AG_PART_VIEW) : NULL;
    ag_tensor *u = g ? ag_part(ctx, llama_site(s, i, "mlp.up_proj"), y, M * I, nd, shape, AG_PART_VIEW) : NULL;
    ag_release(y);
    ag_tensor *a = u ? ag_silu(ctx, llama_site(s, i, "mlp.act"), g) : NULL;
    ag_release(g);
    ag_tensor *m = a ? ag_mul(ctx, llama_site(s, i, "mlp.up_mul_act"), u, a) : NULL;
    ag_release(u);
    ag_release(a);
    return m;
}
