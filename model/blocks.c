// What the training forward and generation share: site labels and the MLP half of a block.
#include "blocks.h"

#include <stdio.h>

#define REL(t) (ag_release(t), (t) = NULL)

// "layers.<i>.<what>": the site prefix of an op inside block i.
const char *llama_site(char buf[96], int64_t i, const char *what) {
    snprintf(buf, 96, "layers.%lld.%s", (long long)i, what);
    return buf;
}

// x[B, T, H] -> x + down(silu(gate(norm(x))) * up(norm(x))); takes ownership of x.
ag_tensor *llama_mlp_block(ag_ctx *ctx, const llama_config *c, const llama_layer *L, ag_tensor *x,
                           int64_t i) {
    char s[96];
    ag_tensor *h = ag_rmsnorm(ctx, llama_site(s, i, "post_attention_layernorm"), x, L->post_norm, (float)c->rms_eps);
    ag_tensor *g = ag_linear(ctx, llama_site(s, i, "mlp.gate_proj"), h, L->gate);
    ag_tensor *u = ag_linear(ctx, llama_site(s, i, "mlp.up_proj"), h, L->up);
    REL(h);
    ag_tensor *a = ag_silu(ctx, llama_site(s, i, "mlp.act"), g);
    REL(g);
    ag_tensor *m = ag_mul(ctx, llama_site(s, i, "mlp.act_mul_up"), a, u);
    REL(a);
    REL(u);
    ag_tensor *d = ag_linear(ctx, llama_site(s, i, "mlp.down_proj"), m, L->down);
    REL(m);
    ag_tensor *y = ag_add(ctx, llama_site(s, i, "mlp_residual"), x, d);
    ag_release(x);
    ag_release(d);
    return y;
}
