// Nodes of the tape: what an op recorded for its backward.
#include <stdlib.h>

#include <string.h>

#include "ag_internal.h"

bool ag_needs_grad(const ag_ctx *ctx, const ag_tensor *t) { return ctx->grad_enabled && (t->node || t->requires_grad); }

bool ag_any_needs_grad(const ag_ctx *ctx, int n, ag_tensor *const *ins) {
    for (int i = 0; i < n; i++)
        if (ag_needs_grad(ctx, ins[i])) return true;
    return false;
}

static ag_edge edge_to(ag_tensor *t) {
    if (t->node) return (ag_edge){.kind = AG_EDGE_NODE, .node = t->node};
    if (t->requires_grad) // a leaf: keep it alive until its gradient was written
        return (ag_edge){.kind = AG_EDGE_LEAF, .leaf = ag_retain(t)};
    return (ag_edge){.kind = AG_EDGE_NONE};
}

bool ag_first_edge_to(const ag_node *n, int i) {
    for (int j = 0; j < i; j++)
        if (n->in[j].kind == AG_EDGE_LEAF && n->in[j].leaf == n->in[i].leaf) return false;
    return true;
}

ag_node *ag_record(ag_ctx *ctx, const ag_op *op, const char *base, ag_tensor *out, int n, ag_tensor *const *ins) {
    ag_node *node = calloc(1, sizeof *node);
    if (!node) {
        ag_fail(ctx, AG_ERR_NOMEM, "%s %s: out of memory for its tape node", op->name, base);
        return NULL;
    }
    node->op = op;
    node->site = mp_site_id(base);
    node->in = n <= AG_MAX_INPUTS ? node->in_inline : calloc((size_t)n, sizeof *node->in);
    if (!node->in) {
        free(node);
        ag_fail(ctx, AG_ERR_NOMEM, "%s %s: out of memory for its tape node", op->name, base);
        return NULL;
    }
    node->ninputs = n;
    for (int i = 0; i < n; i++) {
        node->in[i] = edge_to(ins[i]);
        if (node->in[i].kind == AG_EDGE_LEAF && ag_first_edge_to(node, i)) node->in[i].leaf->tape_nodes++;
    }
    node->numel = out->numel;
    node->ndim = out->ndim;
    memcpy(node->shape, out->shape, sizeof node->shape);
    // A gradient has its tensor's dtype under PYTORCH semantics; LEAN keeps them at the
    // activations' dtype.
    node->grad_dtype =
        AG_FW(ctx->fw, typed_tensors) ? out->dtype : ag_dtype_of_bits(ctx->dtype.act_bits, ctx->dtype.fp16);
    if (!ag_tape_push(ctx, node)) {
        ag_node_free(node);
        return NULL;
    }
    node->out = out;
    out->node = node;
    out->requires_grad = true;
    return node;
}

void ag_node_free(ag_node *n) {
    for (int i = 0; i < n->op->nsaved; i++) ag_release(n->state.saved[i]);
    for (int i = n->ninputs - 1; i >= 0; i--) // the last edge to a leaf uncounts it
        if (n->in[i].kind == AG_EDGE_LEAF) {
            if (ag_first_edge_to(n, i)) n->in[i].leaf->tape_nodes--;
            ag_release(n->in[i].leaf);
        }
    mp_free(&n->grad);
    if (n->out) { // the output outlives its graph: it is a constant from now on
        n->out->node = NULL;
        n->out->requires_grad = false;
    }
    if (n->op->release) n->op->release(&n->state);
    if (n->in != n->in_inline) free(n->in);
    free(n);
}

// The tensor whose block holds t's data: its base for a view.
static const ag_tensor *storage_of(const ag_tensor *t) { return t && t->base ? t->base : t; }

bool ag_tape_node(const ag_ctx *ctx, size_t i, ag_node_info *info) {
    if (i >= ctx->ntape) return false;
    const ag_node *n = ctx->tape[i];
    *info = (ag_node_info){.op = n->op->name, .site = mp_site_name(n->site)};
    for (int j = 0; j < n->op->nsaved; j++) {
        const ag_tensor *t = storage_of(n->state.saved[j]); // a view keeps its base's block
        if (!t) continue;
        info->saved[info->nsaved++] = t;
        if (t->block.category == MP_ACTIVATION) info->saved_bytes += t->block.bytes;
    }
    return true;
}

// Whether t is saved by an earlier slot than (node i, slot j): shared tensors (and views of one
// base) count once.
static bool saved_before(const ag_ctx *ctx, const ag_tensor *t, size_t i, int j) {
    for (size_t a = 0; a <= i; a++)
        for (int b = 0; b < (a == i ? j : ctx->tape[a]->op->nsaved); b++)
            if (storage_of(ctx->tape[a]->state.saved[b]) == t) return true;
    return false;
}

uint64_t ag_tape_saved_bytes(const ag_ctx *ctx) {
    uint64_t bytes = 0;
    for (size_t i = 0; i < ctx->ntape; i++)
        for (int j = 0; j < ctx->tape[i]->op->nsaved; j++) {
            const ag_tensor *t = storage_of(ctx->tape[i]->state.saved[j]);
            if (t && t->block.category == MP_ACTIVATION && !saved_before(ctx, t, i, j)) bytes += t->block.bytes;
        }
    return bytes;
}

bool ag_tape_push(ag_ctx *ctx, ag_node *n) {
    if (ctx->ntape == ctx->cap) {
        size_t cap = ctx->cap ? 2 * ctx->cap : 256;
        ag_node **tape = realloc(ctx->tape, cap * sizeof *tape);
        if (!tape) return ag_fail(ctx, AG_ERR_NOMEM, "out of memory growing the tape to %zu nodes", cap);
        ctx->tape = tape;
        ctx->cap = cap;
    }
    n->index = ctx->ntape;
    ctx->tape[ctx->ntape++] = n;
    return true;
}

void ag_tape_clear_to(ag_ctx *ctx, size_t floor) {
    // Newest first, as backward would: a node's saved tensors may be older nodes' outputs.
    while (ctx->ntape > floor) ag_node_free(ctx->tape[--ctx->ntape]);
}

void ag_tape_clear(ag_ctx *ctx) {
    ag_tape_clear_to(ctx, 0);
    while (ctx->nheld) ag_release(ctx->held[--ctx->nheld]);
}

bool ag_graph_hold(ag_ctx *ctx, ag_tensor *t) {
    if (ctx->nheld == ctx->heldcap) {
        size_t cap = ctx->heldcap ? 2 * ctx->heldcap : 16;
        ag_tensor **h = realloc(ctx->held, cap * sizeof *h);
        if (!h) return ag_fail(ctx, AG_ERR_NOMEM, "out of memory keeping %s for the graph", ag_tensor_name(t));
        ctx->held = h, ctx->heldcap = cap;
    }
    ctx->held[ctx->nheld++] = ag_retain(t);
    return true;
}

size_t ag_tape_size(const ag_ctx *ctx) { return ctx->ntape; }
