// The training step's bill in closed form, from the shapes and the ops' saved tensors, at the
// element sizes of a dtype; and the exact bytes of quantised weights.
#include "model.h"

static void moe_terms(const llama_config *c, uint64_t BT, uint64_t a, llama_closed_form *out);
static void closed_form_peak(const llama_config *c, uint64_t BT, uint64_t a, llama_closed_form *out);

// The head at the start of backward: the final norm's input and output, the logits and their
// gradient, the float32 rstd and log-sum-exp rows. Under Gemma 2's final soft-cap, the cap's
// backward: its output (kept), the capped logits' gradient and the raw ones' beside the loss
// ([1]), the log-sum-exp gone.
static uint64_t head_moment(const llama_config *c, uint64_t BT, uint64_t a) {
    const uint64_t H = (uint64_t)c->hidden, V = (uint64_t)c->vocab, f32 = 4;
    if (c->final_softcap > 0.0) return (2 * BT * H + 3 * BT * V + 1) * a + BT * f32;
    return (2 * BT * H + 2 * BT * V) * a + 2 * BT * f32;
}

// deepseek_v3's latent attention keeps, where a block keeps q, k, v and the attention's output: q
// and k at nope + rope a head and v and the output at v_head_dim (the attention's and o_proj's),
// the compressed kv (kv_a_layernorm's input) and its norm (kv_b_proj's input) with a float32 rstd
// a row, and with q_lora_rank q_a_proj's output and its norm alike.
static uint64_t mla_saved(const llama_config *c, uint64_t BT, uint64_t a) {
    const llama_mla *m = &c->mla;
    const uint64_t H = (uint64_t)c->heads, Dq = (uint64_t)(m->qk_nope + m->qk_rope), Dv = (uint64_t)m->v_head,
                   Lk = (uint64_t)m->kv_lora_rank, Qr = (uint64_t)m->q_lora_rank;
    return (2 * BT * H * Dq + 2 * BT * H * Dv + 2 * BT * Lk + 2 * BT * Qr) * a + (Qr ? 2 : 1) * BT * 4;
}

void llama_closed_form_dtype(const llama_config *c, int64_t batch, int64_t seq, const llama_dtype_bytes *d,
                             llama_closed_form *out) {
    const uint64_t B = (uint64_t)batch, T = (uint64_t)seq, H = (uint64_t)c->hidden, I = (uint64_t)c->intermediate,
                   D = (uint64_t)c->head_dim, hq = (uint64_t)c->heads, hkv = (uint64_t)c->kv_heads;
    const uint64_t BT = B * T, a = d->activation, f32 = 4;
    out->params = out->grad_params = out->state_params = llama_param_count(c);
    out->weights = (out->params + llama_buffer_count(c)) * d->weight; // deepseek_v3's bias buffers billed as weight
    out->gradients = out->params * d->gradient;
    out->optimizer = out->params * d->optimizer;
    out->act_probs_per_block = B * hq * T * T * a;
    out->flash = false; // llama_closed_form_flash turns it into flash attention's
    out->act_lse_per_block = 0;
    out->act_per_block = (4 * BT * H + 4 * BT * I) * a + 2 * BT * f32 + out->act_probs_per_block +
                         (c->mla.kv_lora_rank ? mla_saved(c, BT, a) : (2 * BT * hq * D + 2 * BT * hkv * D) * a);
    // Qwen3's q_norm and k_norm keep their inputs (q and k before RoPE) and an rstd per head
    if (c->qk_norm) out->act_per_block += BT * (hq + hkv) * D * a + BT * (hq + hkv) * f32;
    // Gemma 2's norms of the attention's and the MLP's outputs keep those and an rstd each
    if (c->ff_norms) out->act_per_block += 2 * BT * H * a + 2 * BT * f32;
    out->act_head = head_moment(c, BT, a);
    out->kv_cache = llama_kv_cache_elems_per_token(c) * T * B * a;
    out->closed = true;
    moe_terms(c, BT, a, out);
    closed_form_peak(c, BT, a, out);
}

// A sparse block's difference from a dense one, and the shared expert's share of it.
static void moe_terms(const llama_config *c, uint64_t BT, uint64_t a, llama_closed_form *out) {
    const llama_moe *m = &c->moe;
    out->moe_blocks = 0;
    out->act_moe_delta = out->act_shared_saved = out->act_experts_moment = 0;
    if (m->experts <= 0) return;
    for (int64_t i = 0; i < c->layers; i++) out->moe_blocks += llama_layer_moe(c, i);
    const uint64_t H = (uint64_t)c->hidden, I = (uint64_t)c->intermediate, E = (uint64_t)m->experts,
                   k = (uint64_t)m->top_k, Im = (uint64_t)m->intermediate, Is = (uint64_t)m->shared_intermediate;
    out->act_shared_saved = Is ? (4 * BT * Is + BT * (m->shared_gate ? 1 + H : 0)) * a : 0;
    // the router's float32 softmax: over every expert, or (gpt_oss) over the k it chose
    const uint64_t routed = m->router == LLAMA_ROUTER_TOPK_SOFTMAX ? k : E;
    out->act_moe_delta = BT * routed * 4 + BT * k * a + 2 * BT * k * Im * a + out->act_shared_saved;
    out->act_moe_delta -= 4 * BT * I * a; // what a dense block's MLP keeps, which a sparse one does not
}

// The activation peak: the head's moment, or the last sparse block's experts backward.
static void closed_form_peak(const llama_config *c, uint64_t BT, uint64_t a, llama_closed_form *out) {
    const uint64_t L = (uint64_t)c->layers;
    const uint64_t saved = L * out->act_per_block + (uint64_t)out->moe_blocks * out->act_moe_delta;
    // the load-balancing loss's backward runs first: each sparse layer's router logits then hold
    // their gradient until the router's own backward
    const uint64_t aux = c->moe.aux_loss ? (uint64_t)out->moe_blocks * BT * (uint64_t)c->moe.experts * a : 0;
    out->activations = saved + out->act_head + aux;
    if (out->moe_blocks == 0) return;
    int64_t last = c->layers - 1;
    while (last > 0 && !llama_layer_moe(c, last)) last--;
    uint64_t upto = 0; // the saved sets of the blocks up to the last sparse one
    for (int64_t i = 0; i <= last; i++) upto += out->act_per_block + (llama_layer_moe(c, i) ? out->act_moe_delta : 0);
    const uint64_t H = (uint64_t)c->hidden, k = (uint64_t)c->moe.top_k, Im = (uint64_t)c->moe.intermediate;
    const bool shared = c->moe.shared_intermediate > 0;
    // gpt_oss's stacked experts hold the gate_up gradient (2 Im a pair) where the others hold up's (Im)
    const uint64_t stacked = c->family == LLAMA_FAMILY_GPT_OSS ? BT * k * Im * a : 0;
    out->act_experts_moment = upto - out->act_shared_saved + aux + (shared ? 3 : 2) * BT * H * a +
                              3 * BT * k * (H + Im) * a + stacked + (shared ? 0 : BT * H * a) + BT * k * a;
    if (out->act_experts_moment > out->activations) out->activations = out->act_experts_moment;
}

void llama_closed_form_flash(const llama_config *c, int64_t batch, int64_t seq, llama_closed_form *out) {
    out->flash = true;
    out->act_lse_per_block = (uint64_t)batch * (uint64_t)c->heads * (uint64_t)seq * 4;
    out->act_per_block = out->act_per_block - out->act_probs_per_block + out->act_lse_per_block;
    out->act_probs_per_block = 0;
    // the activations' element size, from the head's terms (their float32 rows set apart)
    const uint64_t BT = (uint64_t)batch * (uint64_t)seq, rows = 2 * BT * ((uint64_t)c->hidden + (uint64_t)c->vocab);
    closed_form_peak(c, BT, (out->act_head - 2 * BT * 4) / rows, out);
}

// Full recomputation keeps only each block's input through forward, so the activation peak is
// one of two moments. The head's, when the logits' gradient is allocated: every block input,
// the final norm's input and output, its rstd, the log-sum-exp rows, logits and their
// gradient. Or the last block's backward (the first to run, with every input still kept): its
// recomputed saved set and the gradient of its output (the residual stream's), then in the
// MLP's backward, down_proj's allocating d(product) [B, T, I] next to d(down out) [B, T, H],
// and the product's freeing its own [B, T, I] before the product's backward allocates
// d(silu) and d(up) [B, T, I] each: the larger of the two is 2 x [B, T, I] or one of each.
void llama_closed_form_checkpointing(const llama_config *c, int64_t batch, int64_t seq, const llama_dtype_bytes *d,
                                     llama_closed_form *out) {
    const uint64_t B = (uint64_t)batch, T = (uint64_t)seq, a = d->activation;
    const uint64_t BT = B * T, H = (uint64_t)c->hidden, I = (uint64_t)c->intermediate, L = (uint64_t)c->layers;
    out->checkpointing = true;
    out->act_block_inputs = L * BT * H * a;
    out->act_head_moment = head_moment(c, BT, a);
    // The loss tensor ([1]) is still held by the caller then.
    out->act_recompute = out->act_per_block + (BT * I + (I > H ? BT * I : BT * H) + 1) * a;
    // Gemma 2: the MLP's output norm ran its backward first, its saved input and rstd gone by then
    if (c->ff_norms) out->act_recompute -= BT * H * a + BT * 4;
    out->activations =
        out->act_block_inputs + (out->act_head_moment > out->act_recompute ? out->act_head_moment : out->act_recompute);
    out->closed = out->moe_blocks == 0; // a sparse block's recomputation and backward are not closed
}

int llama_closed_form_routing(const llama_config *c, const llama_routing *r, int64_t tokens, int64_t steps,
                              int64_t accum, const llama_dtype_bytes *d, llama_closed_form *out, ag_err *err) {
    if (llama_routing_trained(r, c, tokens, steps, accum, &out->grad_params, &out->state_params, err) != 0) return -1;
    out->gradients = out->grad_params * d->gradient;
    out->optimizer = out->state_params * d->optimizer;
    return 0;
}

void llama_closed_form_compute(const llama_config *c, int64_t batch, int64_t seq, uint64_t optimizer_bytes_per_param,
                               bool checkpointing_on, llama_closed_form *out) {
    llama_dtype_bytes d = {4, 4, 4, optimizer_bytes_per_param, optimizer_bytes_per_param};
    llama_closed_form_dtype(c, batch, seq, &d, out);
    out->checkpointing = false;
    out->act_block_inputs = out->act_head_moment = out->act_recompute = 0;
    if (checkpointing_on) llama_closed_form_checkpointing(c, batch, seq, &d, out);
}

uint64_t llama_weight_bytes(const llama_config *c, int bits, int64_t group, int scale_bytes, int vector_bits) {
    uint64_t total = 0;
    for (size_t i = 0; i < llama_param_count_tensors(c); i++) {
        llama_param_info p;
        if (llama_param_info_of(c, i, &p) != 0) return 0;
        // a matrix's rows: every dimension but the last (a stack of experts' matrices included)
        uint64_t rows =
                     (uint64_t)p.shape[0] * (uint64_t)p.shape[1] * (uint64_t)p.shape[2] / (uint64_t)p.shape[p.ndim - 1],
                 cols = (uint64_t)p.shape[p.ndim - 1];
        const int ndim = p.ndim;
        if (bits >= 16)
            total += rows * cols * (uint64_t)bits / 8;
        else if (ndim == 1)
            total += cols * (uint64_t)vector_bits / 8;
        else
            total += (rows * cols * (uint64_t)bits + 7) / 8 +
                     (group ? rows * ((cols + (uint64_t)group - 1) / (uint64_t)group) * (uint64_t)scale_bytes : 0);
    }
    return total;
}

void llama_closed_form_lora(const llama_config *c, const llama_lora_config *l, const llama_dtype_bytes *d,
                            int base_bits, int64_t group, int scale_bytes, bool nf4, llama_lora_closed_form *out) {
    out->base_params = llama_param_count(c);
    out->adapter_params = llama_lora_param_count(c, l);
    out->base_weights = 0;
    const size_t n = llama_param_count_tensors(c);
    for (size_t i = 0; i < n; i++) {
        llama_param_info p;
        if (llama_param_info_of(c, i, &p) != 0) return;
        const uint64_t cols = (uint64_t)p.shape[p.ndim - 1],
                       numel = (uint64_t)p.shape[0] * (uint64_t)p.shape[1] * (uint64_t)p.shape[2], rows = numel / cols;
        const bool block_matrix = p.matrix;
        if (!block_matrix || base_bits >= 16)
            out->base_weights += numel * (block_matrix ? (uint64_t)base_bits / 8 : d->weight);
        else if (nf4)
            out->base_weights += ag_nf4_bytes(numel);
        else
            out->base_weights +=
                (numel * (uint64_t)base_bits + 7) / 8 +
                (group ? rows * ((cols + (uint64_t)group - 1) / (uint64_t)group) * (uint64_t)scale_bytes : 0);
    }
    // adapters of their own dtype (ag_param_new_bits): weight, gradient and state of that dtype
    const bool own = l->adapter_bits != 0;
    out->adapter_weights = out->adapter_params * (own ? (uint64_t)l->adapter_bits / 8 : d->weight);
    out->weights = out->base_weights + out->adapter_weights;
    out->gradients = out->adapter_params * (own ? (uint64_t)l->adapter_bits / 8 : d->gradient);
    out->optimizer = out->adapter_params * (own ? d->own_optimizer : d->optimizer);
}
