// The training forward of LlamaForCausalLM, one op at a time. Each intermediate is released
// as soon as the next op has it, so what stays alive is exactly what the tape saved.
#include "blocks.h"

#include <stdint.h>
#include <stdio.h>

#define REL(t) (ag_release(t), (t) = NULL)


// x[B, T, H] -> x + attention(norm(x)); takes ownership of x.
static ag_tensor *attention_block(ag_ctx *ctx, const llama_config *c, const llama_layer *L,
                                  ag_tensor *x, int64_t i) {
    char s[96];
    const int hq = (int)c->heads, hkv = (int)c->kv_heads, hd = (int)c->head_dim;
    const float theta = (float)c->rope_theta;
    ag_tensor *h = ag_rmsnorm(ctx, llama_site(s, i, "input_layernorm"), x, L->input_norm, (float)c->rms_eps);
    ag_tensor *q = ag_linear(ctx, llama_site(s, i, "self_attn.q_proj"), h, L->q);
    ag_tensor *k = ag_linear(ctx, llama_site(s, i, "self_attn.k_proj"), h, L->k);
    ag_tensor *v = ag_linear(ctx, llama_site(s, i, "self_attn.v_proj"), h, L->v);
    REL(h);
    ag_tensor *qr = ag_rope(ctx, llama_site(s, i, "self_attn.q_rope"), q, hq, hd, theta, 0);
    ag_tensor *kr = ag_rope(ctx, llama_site(s, i, "self_attn.k_rope"), k, hkv, hd, theta, 0);
    REL(q);
    REL(k);
    ag_tensor *a = ag_attention(ctx, llama_site(s, i, "self_attn"), qr, kr, v, hq, hkv, hd);
    REL(qr);
    REL(kr);
    REL(v);
    ag_tensor *o = ag_linear(ctx, llama_site(s, i, "self_attn.o_proj"), a, L->o);
    REL(a);
    ag_tensor *y = ag_add(ctx, llama_site(s, i, "attn_residual"), x, o);
    ag_release(x);
    ag_release(o);
    return y;
}


ag_tensor *llama_forward_loss(ag_ctx *ctx, llama_model *m, const int32_t *ids, int64_t B,
                              int64_t T, llama_err *err) {
    const llama_config *c = &m->cfg;
    if (B < 1 || B > INT32_MAX / c->max_positions || T < 2 || T > c->max_positions) {
        llama_err_set(err, "batch %lld x length %lld: a training step needs batch >= 1 and 2 to %lld tokens",
                      (long long)B, (long long)T, (long long)c->max_positions);
        return NULL;
    }
    if (!mp_is_meta() && llama_check_tokens(c, ids, (size_t)(B * T), err) != 0) return NULL;
    ag_tensor *x = ag_embedding(ctx, "embed_tokens", ids, B, T, m->embed);
    for (int64_t i = 0; i < c->layers && x; i++) {
        x = attention_block(ctx, c, &m->layers[i], x, i);
        x = llama_mlp_block(ctx, c, &m->layers[i], x, i);
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
