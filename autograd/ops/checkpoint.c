// checkpoint: y = fn(x), keeping x (and what the framework keeps of the block's other arguments)
// in forward and recomputing the block in backward.
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
    // What the node holds beyond its backward stays with the graph (its saved tensors go below).
    for (int k = 0; k < AG_NSAVED(checkpoint); k++)
        if ((st->held >> k & 1) && st->saved[k] && !ag_graph_hold(ctx, st->saved[k])) return;
    size_t floor = ctx->ntape;
    // torch.random.fork_rng keeps the surrounding state while the block runs again
    ag_tensor *fork =
        st->rng ? ag_tensor_new_bits(ctx, 1, st->rng->shape, MP_ACTIVATION, ag_tensor_name(st->rng), 8) : NULL;
    if (st->rng && !fork) return;
    bool was = ag_set_grad_enabled(ctx, true);
    ag_tensor *y = st->fn(ctx, st->arg, ag_retain(x));
    ag_set_grad_enabled(ctx, was);
    ag_autocast_cache_clear(ctx); // the recomputation's autocast region exits inside fork_rng's
    ag_release(fork);
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

// What the node keeps of the block's other arguments (args: the caller's), as the row says, and
// which of them it holds until the graph goes; the RNG state made here.
static bool keep_args(ag_ctx *ctx, const ag_site *s, const ag_checkpoint_args *args, ag_checkpoint_state *st) {
    const ag_checkpoint_args_kept kept = AG_FW(ctx->fw, checkpoint_args);
    for (int k = 0; args && kept != AG_CKPT_ARGS_NONE && k < 2; k++) {
        st->args[k] = ag_retain(args->tensors[k]), st->tuple[k] = ag_retain(args->tuple[k]);
        st->held |= (unsigned char)((kept == AG_CKPT_ARGS_HELD ? 1u << (1 + k) : 0) | 1u << (3 + k));
    }
    if (!AG_FW(ctx->fw, checkpoint_rng_state)) return true;
    char l[AG_LABEL_MAX];
    ag_label(l, s->base, "rng_state");
    st->rng = ag_tensor_new_bits(ctx, 1, (int64_t[]){AG_TORCH_RNG_STATE_BYTES}, MP_ACTIVATION, l, 8);
    st->held |= 1u << 5;
    return st->rng != NULL;
}

ag_tensor *ag_checkpoint(ag_ctx *ctx, const char *site, ag_block_fn fn, const void *arg, size_t arg_size,
                         ag_tensor *x) {
    return ag_checkpoint_with(ctx, site, fn, arg, arg_size, x, NULL);
}

ag_tensor *ag_checkpoint_with(ag_ctx *ctx, const char *site, ag_block_fn fn, const void *arg, size_t arg_size,
                              ag_tensor *x, const ag_checkpoint_args *args) {
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
    // preserve_rng_state: torch.get_rng_state() before the block runs
    ag_checkpoint_state st = {.fn = fn, .arg = copy};
    if (!keep_args(ctx, &s, args, &st)) {
        free(copy);
        for (int k = 1; k < AG_NSAVED(checkpoint); k++) ag_release(st.saved[k]);
        return NULL;
    }
    ag_set_grad_enabled(ctx, false);
    ag_tensor *y = fn(ctx, copy, ag_retain(x));
    ag_set_grad_enabled(ctx, true);
    ag_node *n = NULL;
    if (y && !(y == x || y->node || y->requires_grad)) n = ag_record(ctx, &checkpoint_op, s.base, y, 1, ins);
    if (!n) { // fn(x) = x, or a tensor made elsewhere (its own graph already leads to it); or failed
        free(copy);
        for (int k = 1; k < AG_NSAVED(checkpoint); k++) ag_release(st.saved[k]);
        if (y && (y == x || y->node || y->requires_grad)) return y;
        ag_release(y);
        return NULL;
    }
    st.x = ag_retain(x);
    n->state.checkpoint = st;
    return y;
}
