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
    // deepseek_v3's module is mlp.shared_experts (no gate), qwen2_moe's mlp.shared_expert
    const char *pre = c->family == LLAMA_FAMILY_DEEPSEEK_V3 ? "mlp.shared_experts" : "mlp.shared_expert";
    ag_tensor *g = ag_linear(ctx, moe_site(s, i, pre, "gate_proj"), h, L->shared_gate, NULL);
    ag_tensor *a = ag_silu(ctx, moe_site(s, i, pre, "act"), g);
    REL(g);
    ag_tensor *u = ag_linear(ctx, moe_site(s, i, pre, "up_proj"), h, L->shared_up, NULL);
    ag_tensor *m = ag_mul(ctx, moe_site(s, i, pre, "act_mul_up"), a, u);
    REL(a), REL(u);
    ag_tensor *d = ag_linear(ctx, moe_site(s, i, pre, "down_proj"), m, L->shared_down, NULL);
    REL(m);
    if (!c->moe.shared_gate) return d;
    ag_tensor *gl = ag_linear(ctx, moe_site(s, i, "mlp", "shared_expert_gate"), h, L->shared_expert_gate, NULL);
    ag_tensor *y = ag_sigmoid_gate(ctx, moe_site(s, i, "mlp", "shared_expert_gated"), gl, d);
    REL(gl), REL(d);
    return y;
}

// Expert parallelism (a simulated rank, meta mode): this rank's tokens go to their experts'
// ranks as an all-to-all of their (token, choice) rows; the rows for its own experts arrive from
// every rank of the group (ep times its share of the routing: every rank routes alike), run
// through them, go back, and are weighted and summed into their tokens here.
static ag_tensor *ep_experts(ag_ctx *ctx, const llama_config *c, const llama_layer *L, ag_tensor *h, ag_tensor *w,
                             const ag_moe_routing *r, int64_t i) {
    char s[96];
    const llama_moe_names *nm = llama_family_moe_names(c->family);
    const int64_t N = r->tokens, k = r->k, ep = c->moe.ep, local = c->moe.experts / ep, H = c->hidden;
    int64_t count[local], R = 0;
    for (int64_t e = 0; e < local; e++) R += (count[e] = r->count[e] * ep);
    ag_tensor *send = ag_index_rows(ctx, moe_site(s, i, nm->prefix, "dispatch"), h, H, NULL, N * k, NULL);
    ag_tensor *recv = R ? ag_all_to_all(ctx, moe_site(s, i, nm->prefix, "dispatch_recv"), send, R) : NULL;
    REL(send);
    ag_tensor *ones = recv ? ag_tensor_new(ctx, 2, (int64_t[]){R, 1}, MP_ACTIVATION, "ep_unweighted") : NULL;
    ag_moe_routing mine = {.tokens = R, .k = 1, .experts = (int)local, .count = count};
    ag_moe_eager hf = {.hit_tensor = nm->hit_tensor, .proj = {nm->proj[0], nm->proj[1], nm->proj[2]}};
    ag_tensor *y = ones ? ag_moe_experts(ctx, moe_site(s, i, nm->prefix, ""), recv, ones, &mine, L->expert_gate,
                                         L->expert_up, L->expert_down, &hf)
                        : NULL;
    REL(recv), REL(ones);
    ag_tensor *back = y ? ag_all_to_all(ctx, moe_site(s, i, nm->prefix, "combine_recv"), y, N * k) : NULL;
    REL(y);
    ag_tensor *yw = ag_scale_rows(ctx, moe_site(s, i, nm->prefix, "combine_scaled"), back, w);
    REL(back);
    ag_tensor *acc =
        yw ? ag_tensor_new(ctx, h->ndim, h->shape, MP_ACTIVATION, moe_site(s, i, nm->prefix, "combine:out")) : NULL;
    ag_tensor *out = acc ? ag_index_add(ctx, moe_site(s, i, nm->prefix, "combine"), acc, NULL, N * k, yw, NULL) : NULL;
    REL(yw);
    return out;
}

// GptOssExperts' alpha, a constant of its code (not of its config).
#define GPT_OSS_ALPHA 1.702f

// gpt_oss's experts, stacked with their biases, through the clamped SwiGLU.
static ag_tensor *stacked_experts(ag_ctx *ctx, const llama_config *c, const llama_layer *L, ag_tensor *h, ag_tensor *w,
                                  const ag_moe_routing *r, int64_t i) {
    char s[96];
    const ag_moe_glu glu = {(float)c->moe.swiglu_limit, GPT_OSS_ALPHA};
    return ag_moe_experts_stacked(ctx, llama_site(s, i, "mlp.experts"), h, w, r, L->experts_gate_up,
                                  L->experts_gate_up_bias, L->experts_down, L->experts_down_bias, &glu);
}

ag_tensor *llama_moe_block(ag_ctx *ctx, const llama_config *c, const llama_layer *L, ag_tensor *x, int64_t i) {
    char s[96];
    const llama_moe_names *nm = llama_family_moe_names(c->family);
    const int E = (int)c->moe.experts, k = (int)c->moe.top_k;
    ag_tensor *h = ag_rmsnorm(ctx, llama_site(s, i, "post_attention_layernorm"), x, L->post_norm, (float)c->rms_eps);
    const bool oss = c->moe.router == LLAMA_ROUTER_TOPK_SOFTMAX; // gpt_oss: mlp.router, with a bias
    ag_tensor *logits = ag_linear(ctx, moe_site(s, i, nm->prefix, oss ? "router" : "gate"), h, L->router,
                                  c->moe.router_bias ? L->router_bias : NULL);
    int64_t tokens = h ? h->numel / c->hidden : 0, count[E];
    ag_moe_routing r = {0};
    float bias[E]; // deepseek_v3's e_score_correction_bias, for the choice alone
    for (int e = 0; L->router_bias && L->router_bias->data && e < E; e++)
        bias[e] = ag_get(L->router_bias->data, L->router_bias->dtype, e);
    const ag_moe_sigmoid_group group = {(int)c->moe.n_group, (int)c->moe.topk_group, (float)c->moe.routed_scaling,
                                        L->router_bias && L->router_bias->data ? bias : NULL};
    ag_moe_route_opts o = {.top_k = k,
                           .renorm = c->moe.norm_topk_prob,
                           .topk_first = oss,
                           .group = c->moe.router == LLAMA_ROUTER_SIGMOID_GROUP ? &group : NULL,
                           .assumed = mp_is_meta() ? count : NULL};
    ag_tensor *w = logits && assumed_counts(ctx, c, L, i, tokens, count)
                       ? ag_moe_route(ctx, moe_site(s, i, nm->prefix, "route"), logits, h, &o, &r)
                       : NULL;
    if (w && L->moe && L->moe->record && !mp_is_meta()) {
        ag_err err;
        if (llama_routing_add(L->moe->record, L->moe->forward, i, tokens, E, k, r.count, &err) != 0)
            ag_ctx_fail(ctx, err.msg), REL(w);
    }
    ag_moe_eager hf = {.hit_tensor = nm->hit_tensor, .proj = {nm->proj[0], nm->proj[1], nm->proj[2]}};
    ag_tensor *y = L->experts_gate_up ? stacked_experts(ctx, c, L, h, w, &r, i)
                   : c->moe.ep > 1    ? (w ? ep_experts(ctx, c, L, h, w, &r, i) : NULL)
                                      : ag_moe_experts(ctx, moe_site(s, i, nm->prefix, ""), h, w, &r, L->expert_gate,
                                                       L->expert_up, L->expert_down, &hf);
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
