// ag_moe_experts under the PyTorch frameworks: transformers' eager loop over the experts that got
// tokens (MixtralSparseMoeBlock.forward, Qwen2MoeSparseMoeBlock.forward), op by op, so that each
// tensor is allocated, kept for backward and freed as PyTorch does:
//   final = zeros(N, H); expert_mask = one_hot(selected, E).permute(2, 1, 0)   [N k E] int64
//   the experts hit: expert_mask.sum((-1, -2)) > 0, nonzero                    (mixtral keeps it)
//   per expert hit: idx, top_x = where(expert_mask[e])                        [c, 2] int64
//     x[None, top_x] -> down(silu(gate(.)) * up(.)) * routing_weights[top_x, idx, None]
//     final.index_add_(0, top_x, .)
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ag_ops.h"
#include "kernels/ag_moe.h"

// "<base>.experts.<e>.<what>"
static const char *site_of(char buf[AG_LABEL_MAX], const char *base, int e, const char *what) {
    snprintf(buf, AG_LABEL_MAX, "%s.experts.%d.%s", base, e, what);
    return buf;
}

// A billed scratch block alloc'd and freed around nothing: what one_hot and the hit test make
// and drop (PyTorch's scalars and reductions).
static bool blip(ag_ctx *ctx, const char *base, const char *what, int64_t bytes) {
    mp_block b = {0};
    bool ok = ag_moe_temp(ctx, &b, base, what, bytes);
    mp_free(&b);
    return ok;
}

// One expert's pass: the gathered rows, its SwiGLU, the weighting, index_add_ into acc.
static ag_tensor *one_expert(ag_ctx *ctx, const ag_site *s, ag_tensor *x, ag_tensor *w, ag_tensor *const *W[3], int e,
                             const ag_moe_eager *hf, const int64_t *tok, const int64_t *pair, int64_t c, ag_tensor *nz,
                             ag_tensor *acc) {
    const int64_t H = x->shape[x->ndim - 1];
    char l[AG_LABEL_MAX];
    ag_tensor *xe = ag_index_rows(ctx, site_of(l, s->base, e, "input"), x, H, tok, c, nz);
    ag_tensor *g = ag_linear(ctx, site_of(l, s->base, e, hf->proj[0]), xe, W[0][e], NULL);
    ag_tensor *a = ag_silu(ctx, site_of(l, s->base, e, "act"), g);
    ag_release(g);
    ag_tensor *u = ag_linear(ctx, site_of(l, s->base, e, hf->proj[1]), xe, W[1][e], NULL);
    ag_release(xe);
    ag_tensor *m = ag_mul(ctx, site_of(l, s->base, e, "act_mul_up"), a, u);
    ag_release(a), ag_release(u);
    ag_tensor *y = ag_linear(ctx, site_of(l, s->base, e, hf->proj[2]), m, W[2][e], NULL);
    ag_release(m);
    ag_tensor *we = ag_index_rows(ctx, site_of(l, s->base, e, "weight"), w, 1, pair, c, nz);
    ag_tensor *yw = ag_scale_rows(ctx, site_of(l, s->base, e, "scaled"), y, we);
    ag_release(y), ag_release(we);
    ag_tensor *out = yw ? ag_index_add(ctx, site_of(l, s->base, e, "index_add"), acc, tok, c, yw, nz) : NULL;
    if (!yw) ag_release(acc);
    ag_release(yw);
    return out;
}

ag_tensor *ag_moe_eager_experts(ag_ctx *ctx, const ag_site *s, ag_tensor *x, ag_tensor *w, const ag_moe_routing *r,
                                ag_tensor *const *W[3], const ag_moe_eager *hf) {
    const int E = r->experts, k = r->k;
    const int64_t N = r->tokens, Nk = N * k;
    ag_moe_groups g;
    if (!ag_moe_group(r, &g)) {
        ag_fail(ctx, AG_ERR_NOMEM, "moe_experts %s: out of memory", s->base);
        return NULL;
    }
    int64_t *tok = g.pair ? malloc((size_t)(Nk > 0 ? Nk : 1) * sizeof *tok) : NULL;
    for (int64_t i = 0; tok && i < Nk; i++) tok[i] = g.pair[i] / k;
    ag_tensor *acc = ag_tensor_like(ctx, x, MP_ACTIVATION, s->out); // final_hidden_states: zeros
    if (acc && acc->data) memset(acc->data, 0, acc->block.bytes);
    // one_hot: its min and max checks, then [N, k, E] int64
    blip(ctx, s->base, "one_hot_check", 8), blip(ctx, s->base, "one_hot_check", 8);
    ag_tensor *mask = ag_moe_int64(ctx, s->base, "expert_mask", Nk * E), *hit = NULL;
    int64_t nhit = 0;
    for (int e = 0; e < E; e++) nhit += r->count[e] > 0;
    mp_block sum = {0}, scalar = {0}, gt = {0};
    ag_moe_temp(ctx, &sum, s->base, "hit_sum", 8 * (int64_t)E);
    ag_moe_temp(ctx, &scalar, s->base, "hit_zero", 8);
    ag_moe_temp(ctx, &gt, s->base, "hit_test", E);
    mp_free(&scalar), mp_free(&sum);
    hit = ag_moe_int64(ctx, s->base, "experts_hit", nhit);
    mp_free(&gt);
    if (!hf->hit_tensor) ag_release(hit), hit = NULL; // .tolist(): Python ints
    if (g.pair && !tok) ag_fail(ctx, AG_ERR_NOMEM, "moe_experts %s: out of memory", s->base);
    for (int e = 0; e < E && acc && ctx->status == AG_OK; e++) {
        const int64_t c = r->count[e], o = g.off[e];
        if (c == 0) continue;
        mp_block slice = {0}; // expert_mask[tensor]: a copy of the expert's [k, N] slice
        if (hf->hit_tensor) ag_moe_temp(ctx, &slice, s->base, "mask_slice", 8 * Nk);
        ag_tensor *nz = ag_moe_int64(ctx, s->base, "where", 2 * c);
        mp_free(&slice);
        if (!nz) {
            ag_release(acc), acc = NULL;
            break;
        }
        acc = one_expert(ctx, s, x, w, W, e, hf, tok ? tok + o : NULL, g.pair ? g.pair + o : NULL, c, nz, acc);
        ag_release(nz);
    }
    ag_release(mask), ag_release(hit);
    free(tok);
    ag_moe_groups_free(&g);
    if (ctx->status != AG_OK) ag_release(acc), acc = NULL;
    return acc;
}
