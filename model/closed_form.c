// The training step's bill in closed form, from the shapes and the ops' saved tensors.
#include "model.h"

void llama_closed_form_compute(const llama_config *c, int64_t batch, int64_t seq,
                               uint64_t optimizer_bytes_per_param, llama_closed_form *out) {
    const uint64_t B = (uint64_t)batch, T = (uint64_t)seq, H = (uint64_t)c->hidden,
                   I = (uint64_t)c->intermediate, V = (uint64_t)c->vocab, D = (uint64_t)c->head_dim,
                   hq = (uint64_t)c->heads, hkv = (uint64_t)c->kv_heads, L = (uint64_t)c->layers;
    const uint64_t BT = B * T, f = sizeof(float);
    out->params = llama_param_count(c);
    out->weights = out->params * f;
    out->gradients = out->params * f;
    out->optimizer = out->params * optimizer_bytes_per_param;
    out->act_probs_per_block = B * hq * T * T * f;
    out->act_per_block = (4 * BT * H + 2 * BT + 2 * BT * hq * D + 2 * BT * hkv * D + 4 * BT * I) * f +
                         out->act_probs_per_block;
    out->act_head = (3 * BT * H + 2 * BT + 2 * BT * V) * f;
    out->activations = L * out->act_per_block + out->act_head;
    out->kv_cache = 2 * L * hkv * D * T * B * f;
}
