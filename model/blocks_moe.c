// The MLP half of a sparse block: the router, the routed experts, the shared expert and its gate
// (qwen2_moe), as transformers' Mixtral, Qwen2Moe and Qwen3Moe sparse blocks compute them.
#include "blocks.h"

#include <stdio.h>
#include <stdlib.h>

#include "model_internal.h"

#define REL(t) (ag_release(t), (t) = NULL)

// "layers.<i>.<prefix>.<what>"
static const char *moe_site(char buf[96], int64_t i, const char *prefix, const char *what) {
    char w[64];
    snprintf(w, sizeof w, "%s%s%s", prefix, what[0] ? "." : "", what);
    return llama_site(buf, i, w);
}

// The tokens each expert gets in a meta run (the assumption); nothing to do in a real one.
static bool assumed_counts(ag_ctx *ctx, const llama_config *c, const llama_layer *L, int64_t i, int64_t tokens,
                           int64_t *count) {
    if (!mp_is_meta()) return true;
    ag_err err;
    if (llama_routing_counts(L->moe ? L->moe->assume : NULL, L->moe ? L->moe->forward : 0, i, tokens,
                             (int)c->moe.experts, (int)c->moe.top_k, count, &err) == 0)
        return true;
    ag_ctx_fail(ctx, err.msg);
    return false;
}

// The shared expert (qwen2_moe): down(silu(gate(h)) * up(h)), scaled by sigmoid(shared_expert_gate(h)).
static ag_tensor *shared_expert(ag_ctx *ctx, const llama_config *c, const llama_layer *L, ag_tensor *h, int64_t i) {
    char s[96];
    ag_tensor *g = ag_linear(ctx, moe_site(s, i, "mlp", "shared_expert.gate_proj"), h, L->shared_gate, NULL);
    ag_tensor *a = ag_silu(ctx, moe_site(s, i, "mlp", "shared_expert.act"), g);
    REL(g);
    ag_tensor *u = ag_linear(ctx, moe_site(s, i, "mlp", "shared_expert.up_proj"), h, L->shared_up, NULL);
    ag_tensor *m = ag_mul(ctx, moe_site(s, i, "mlp", "shared_expert.act_mul_up"), a, u);
    REL(a), REL(u);
    ag_tensor *d = ag_linear(ctx, moe_site(s, i, "mlp", "shared_expert.down_proj"), m, L->shared_down, NULL);
    REL(m);
    if (!c->moe.shared_gate) return d;
    ag_tensor *gl = ag_linear(ctx, moe_site(s, i, "mlp", "shared_expert_gate"), h, L->shared_expert_gate, NULL);
    ag_tensor *y = ag_sigmoid_gate(ctx, moe_site(s, i, "mlp", "shared_expert_gated"), gl, d);
    REL(gl), REL(d);
    return y;
}

ag_tensor *llama_moe_block(ag_ctx *ctx, const llama_config *c, const llama_layer *L, ag_tensor *x, int64_t i) {
    char s[96];
    const llama_moe_names *nm = llama_family_moe_names(c->family);
    const int E = (int)c->moe.experts, k = (int)c->moe.top_k;
    ag_tensor *h = ag_rmsnorm(ctx, llama_site(s, i, "post_attention_layernorm"), x, L->post_norm, (float)c->rms_eps);
    ag_tensor *logits = ag_linear(ctx, moe_site(s, i, nm->prefix, "gate"), h, L->router, NULL);
    int64_t tokens = h ? h->numel / c->hidden : 0, count[E];
    ag_moe_routing r = {0};
    ag_moe_route_opts o = {.top_k = k, .renorm = c->moe.norm_topk_prob, .assumed = mp_is_meta() ? count : NULL};
    ag_tensor *w = logits && assumed_counts(ctx, c, L, i, tokens, count)
                       ? ag_moe_route(ctx, moe_site(s, i, nm->prefix, "route"), logits, h, &o, &r)
                       : NULL;
    if (w && L->moe && L->moe->record && !mp_is_meta()) {
        ag_err err;
        if (llama_routing_add(L->moe->record, L->moe->forward, i, tokens, E, k, r.count, &err) != 0)
            ag_ctx_fail(ctx, err.msg), REL(w);
    }
    ag_moe_eager hf = {.hit_tensor = nm->hit_tensor, .proj = {nm->proj[0], nm->proj[1], nm->proj[2]}};
    ag_tensor *y = ag_moe_experts(ctx, moe_site(s, i, nm->prefix, ""), h, w, &r, L->expert_gate, L->expert_up,
                                  L->expert_down, &hf);
    REL(w);
    ag_moe_routing_free(&r);
    if (L->moe && L->moe->logits && logits && ag_is_grad_enabled(ctx)) L->moe->logits[i] = ag_retain(logits);
    REL(logits); // the block's output tuple drops them, unless the aux loss keeps them
    if (y && c->moe.shared_intermediate > 0) {
        ag_tensor *sh = shared_expert(ctx, c, L, h, i);
        ag_tensor *sum = ag_add(ctx, moe_site(s, i, nm->prefix, "shared_sum"), y, sh);
        REL(y), REL(sh);
        y = sum;
    }
    REL(h);
    ag_tensor *out = ag_add(ctx, llama_site(s, i, "mlp_residual"), x, y);
    ag_release(x);
    ag_release(y);
    return out;
}
