// What a data-parallel engine hangs on a backward: leaf hooks around each node's backward.
#include "ag_internal.h"

void ag_ctx_set_leaf_hooks(ag_ctx *ctx, const ag_leaf_hooks *hooks) {
    if (ctx) ctx->hooks = hooks ? *hooks : (ag_leaf_hooks){0};
}

static bool hook_failed(ag_ctx *ctx, const ag_tensor *leaf, const ag_err *e) {
    ag_status st = mp_oom()->happened ? AG_ERR_BUDGET : AG_ERR_NOMEM;
    return ag_fail(ctx, st, "backward, %s: %s", ag_tensor_name(leaf), e->msg);
}

static bool before(ag_ctx *ctx, ag_tensor *leaf) {
    ag_err e = {""};
    return ctx->hooks.before_backward(ctx->hooks.user, leaf, &e) || hook_failed(ctx, leaf, &e);
}

// The leaves a node reaches, and the parameters it keeps for its backward without reaching them
// (a frozen weight, which the gradient of its input is computed through).
bool ag_hooks_before(ag_ctx *ctx, const ag_node *n) {
    if (!ctx->hooks.before_backward) return true;
    for (int i = 0; i < n->ninputs; i++)
        if (n->in[i].kind == AG_EDGE_LEAF && ag_first_edge_to(n, i) && !before(ctx, n->in[i].leaf)) return false;
    for (int i = 0; i < n->op->nsaved; i++) {
        ag_tensor *t = n->state.saved[i];
        if (t && t->is_param && !t->requires_grad && !before(ctx, t)) return false;
    }
    return true;
}

void ag_hooks_after(ag_ctx *ctx, ag_tensor *const *leaves, int n) {
    for (int i = 0; i < n && ctx->hooks.grad_ready && ctx->status == AG_OK; i++) {
        if (leaves[i]->tape_nodes > 0) continue; // more nodes will reach it
        ag_err e = {""};
        if (!ctx->hooks.grad_ready(ctx->hooks.user, leaves[i], &e)) hook_failed(ctx, leaves[i], &e);
    }
}
