// checkpoint: y = fn(x), keeping only x in forward and recomputing the block in backward.
#include <stdlib.h>
#include <string.h>

#include "ag_ops.h"

// The recomputed output gets the checkpoint's own gradient buffer (same size, no copy): its
// node then backpropagates as in an ordinary backward.
static bool seed_recomputed(ag_ctx *ctx, ag_node *n, ag_tensor *y) {
    if (!y->node) // nothing in the block needs a gradient
        return false;
    if (y->numel != n->numel) {
        ag_fail(ctx, AG_ERR_STATE,
                "checkpoint %s: the recomputed block gave %lld elements, "
                "forward gave %lld",
                mp_site_name(n->site), (long long)y->numel, (long long)n->numel);
        return false;
    }
    y->node->grad = n->grad;
    n->grad = (mp_block){0};
    return true;
}

// Recompute under grad mode on a private part of the tape (the nodes above `floor`, the index
// this node had), run its backward, and leave the tape as it was below. The block's edges to x
// point at x's producer (or x itself, a leaf), so x's gradient lands there directly.
static void checkpoint_backward(ag_ctx *ctx, ag_node *n, const void *dout) {
    (void)dout; // handed over with the buffer that holds it
    const ag_checkpoint_state *st = &n->state.checkpoint;
    ag_tensor *x = st->x;
    size_t floor = ctx->ntape;
    bool was = ag_set_grad_enabled(ctx, true);
    ag_tensor *y = st->fn(ctx, st->arg, ag_retain(x));
    ag_set_grad_enabled(ctx, was);
    ag_autocast_cache_clear(ctx); // the recomputation's own autocast region exits before its backward
    if (y && seed_recomputed(ctx, n, y)) {
        ag_release(y); // its node keeps the gradient; nothing needs the value
        ag_run_tape_to(ctx, floor);
    } else {
        ag_release(y);
        if (!y) ag_fail(ctx, AG_ERR_STATE, "checkpoint %s: the block's recomputation failed", mp_site_name(n->site));
    }
    ag_tape_clear_to(ctx, floor); // after an error: what the failed recomputation recorded
}

static void checkpoint_release(ag_op_state *st) { free(st->checkpoint.arg); }

static const ag_op checkpoint_op = {.name = "checkpoint",
                                    .backward = checkpoint_backward,
                                    .nsaved = AG_NSAVED(checkpoint),
                                    .release = checkpoint_release};

ag_tensor *ag_checkpoint(ag_ctx *ctx, const char *site, ag_block_fn fn, const void *arg, size_t arg_size,
                         ag_tensor *x) {
    ag_tensor *ins[] = {x};
    if (!ag_check_inputs(ctx, "checkpoint", site, 1, ins, (const char *[]){"x"})) return NULL;
    ag_site s;
    ag_site_parse(&s, site);
    if (!fn || (arg_size && !arg)) {
        ag_fail(ctx, AG_ERR_ARG,
                "checkpoint %s: no block function, or a NULL argument of "
                "%zu bytes",
                s.base, arg_size);
        return NULL;
    }
    if (!ag_is_grad_enabled(ctx)) return fn(ctx, arg, ag_retain(x));
    // The copy, not the caller's argument, serves both runs: the block sees the same bytes.
    void *copy = arg_size ? malloc(arg_size) : NULL;
    if (arg_size && !copy) {
        ag_fail(ctx, AG_ERR_NOMEM, "checkpoint %s: out of memory for its argument", s.base);
        return NULL;
    }
    if (arg_size) memcpy(copy, arg, arg_size);
    ag_set_grad_enabled(ctx, false);
    ag_tensor *y = fn(ctx, copy, ag_retain(x));
    ag_set_grad_enabled(ctx, true);
    if (y && (y == x || y->node || y->requires_grad)) { // fn(x) = x, or a tensor made elsewhere:
        free(copy);                                     // its own graph already leads to it
        return y;
    }
    ag_node *n = y ? ag_record(ctx, &checkpoint_op, s.base, y, 1, ins) : NULL;
    if (!n) {
        free(copy);
        ag_release(y);
        return NULL;
    }
    n->state.checkpoint = (ag_checkpoint_state){.x = ag_retain(x), .fn = fn, .arg = copy};
    return y;
}
