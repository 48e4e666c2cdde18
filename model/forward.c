// The training forward of LlamaForCausalLM, one op at a time. Each intermediate is released
// as soon as the next op has it, so what stays alive is exactly what the tape saved.
#include "model.h"

#include <stdio.h>

#define REL(t) (ag_release(t), (t) = NULL)

// x[B, T, H] -> x + attention(norm(x)); takes ownership of x.
static ag_tensor *attention_block(ag_ctx *ctx, const llama_config *c, const llama_layer *L,
                                  ag_tensor *x, int64_t i) {
    char s[96];
    const int hq = (int)c->heads, hkv = (int)c->kv_heads, hd = (int)c->head_dim;
    const float theta = (float)c->rope_theta;
    snprintf(s, sizeof s, "layers.%lld.input_layernorm", (long long)i);
    ag_tensor *h = ag_rmsnorm(ctx, s, x, L->input_norm, (float)c->rms_eps);
    snprintf(s, sizeof s, "layers.%lld.self_attn.q_proj", (long long)i);
    ag_tensor *q = ag_linear(ctx, s, h, L->q);
    snprintf(s, sizeof s, "layers.%lld.self_attn.k_proj", (long long)i);
    ag_tensor *k = ag_linear(ctx, s, h, L->k);
    snprintf(s, sizeof s, "layers.%lld.self_attn.v_proj", (long long)i);
    ag_tensor *v = ag_linear(ctx, s, h, L->v);
    REL(h);
    snprintf(s, sizeof s, "layers.%lld.self_attn.q_rope", (long long)i);
    ag_tensor *qr = ag_rope(ctx, s, q, hq, hd, theta, 0);
    snprintf(s, sizeof s, "layers.%lld.self_attn.k_rope", (long long)i);
    ag_tensor *kr = ag_rope(ctx, s, k, hkv, hd, theta, 0);
    REL(q);
    REL(k);
    snprintf(s, sizeof s, "layers.%lld.self_attn", (long long)i);
    ag_tensor *a = ag_attention(ctx, s, qr, kr, v, hq, hkv, hd);
    REL(qr);
    REL(kr);
    REL(v);
    snprintf(s, sizeof s, "layers.%lld.self_attn.o_proj", (long long)i);
    ag_tensor *o = ag_linear(ctx, s, a, L->o);
    REL(a);
    snprintf(s, sizeof s, "layers.%lld.attn_residual", (long long)i);
    ag_tensor *y = ag_add(ctx, s, x, o);
    ag_release(x);
    ag_release(o);
    return y;
}

// x[B, T, H] -> x + down(silu(gate(norm(x))) * up(norm(x))); takes ownership of x.
static ag_tensor *mlp_block(ag_ctx *ctx, const llama_config *c, const llama_layer *L, ag_tensor *x,
                            int64_t i) {
    char s[96];
    snprintf(s, sizeof s, "layers.%lld.post_attention_layernorm", (long long)i);
    ag_tensor *h = ag_rmsnorm(ctx, s, x, L->post_norm, (float)c->rms_eps);
    snprintf(s, sizeof s, "layers.%lld.mlp.gate_proj", (long long)i);
    ag_tensor *g = ag_linear(ctx, s, h, L->gate);
    snprintf(s, sizeof s, "layers.%lld.mlp.up_proj", (long long)i);
    ag_tensor *u = ag_linear(ctx, s, h, L->up);
    REL(h);
    snprintf(s, sizeof s, "layers.%lld.mlp.act", (long long)i);
    ag_tensor *a = ag_silu(ctx, s, g);
    REL(g);
    snprintf(s, sizeof s, "layers.%lld.mlp.act_mul_up", (long long)i);
    ag_tensor *m = ag_mul(ctx, s, a, u);
    REL(a);
    REL(u);
    snprintf(s, sizeof s, "layers.%lld.mlp.down_proj", (long long)i);
    ag_tensor *d = ag_linear(ctx, s, m, L->down);
    REL(m);
    snprintf(s, sizeof s, "layers.%lld.mlp_residual", (long long)i);
    ag_tensor *y = ag_add(ctx, s, x, d);
    ag_release(x);
    ag_release(d);
    return y;
}

ag_tensor *llama_forward_loss(ag_ctx *ctx, llama_model *m, const int32_t *ids, int64_t B,
                              int64_t T, llama_err *err) {
    const llama_config *c = &m->cfg;
    if (B < 1 || T < 2 || T > c->max_positions) {
        llama_err_set(err, "batch %lld x length %lld: a training step needs batch >= 1 and 2 to %lld tokens",
                      (long long)B, (long long)T, (long long)c->max_positions);
        return NULL;
    }
    if (!mp_is_meta() && llama_check_tokens(c, ids, (size_t)(B * T), err) != 0) return NULL;
    ag_tensor *x = ag_embedding(ctx, "embed_tokens", ids, B, T, m->embed);
    for (int64_t i = 0; i < c->layers && x; i++) {
        x = attention_block(ctx, c, &m->layers[i], x, i);
        x = mlp_block(ctx, c, &m->layers[i], x, i);
    }
    ag_tensor *n = ag_rmsnorm(ctx, "norm", x, m->norm, (float)c->rms_eps);
    ag_release(x);
    ag_tensor *logits = ag_linear(ctx, "lm_head:logits", n, m->lm_head);
    ag_release(n);
    ag_tensor *loss = ag_cross_entropy(ctx, "loss", logits, ids);
    ag_release(logits);
    if (!loss) llama_err_set(err, "forward: %s", ag_ctx_error(ctx) ? ag_ctx_error(ctx) : "failed");
    return loss;
}
