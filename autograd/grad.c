// The backward pass and the gradient buffers it hands to the ops' backward functions.
#include <stdlib.h>
#include <string.h>

#include "ag_internal.h"
#include "kernels/ag_kernels.h"

// A leaf's gradient: the context's gradient dtype, or a parameter's own (ag_param_new_bits).
static int grad_bits(const ag_ctx *ctx, const ag_tensor *leaf) {
    return leaf && leaf->own_bits ? leaf->bits : ctx->dtype.grad_bits;
}
static ag_dtype grad_dtype(const ag_ctx *ctx, const ag_tensor *leaf) {
    return ag_dtype_of_bits(grad_bits(ctx, leaf), ctx->dtype.fp16);
}

static bool leaf_grad(ag_ctx *ctx, ag_tensor *leaf, ag_grad_dst *dst) {
    if (!leaf->grad) {
        char label[AG_LABEL_MAX];
        ag_label(label, ag_tensor_name(leaf), "grad");
        leaf->grad = leaf->own_bits ? ag_tensor_new_bits(ctx, leaf->ndim, leaf->shape, MP_GRADIENT, label, leaf->bits)
                                    : ag_tensor_like(ctx, leaf, MP_GRADIENT, label);
        if (!leaf->grad) return false;
        dst->fresh = true;
    }
    dst->data = leaf->grad->data;
    dst->dtype = leaf->grad->dtype;
    return true;
}

// PyTorch's engine: each gradient of a leaf without .grad is a tensor of its own. Alone, it
// becomes .grad; when more nodes will reach the leaf, it waits in the input buffer, and the next
// one is summed with it out of place once its node's backward is done (ag_leaf_grads_settle).
static bool leaf_grad_pytorch(ag_ctx *ctx, ag_tensor *leaf, ag_grad_dst *dst) {
    if (leaf->grad_new.bytes) { // a second edge of the same node: write into the same buffer
        dst->data = leaf->grad_new.data;
        dst->dtype = grad_dtype(ctx, leaf);
        return true;
    }
    if (leaf->grad || (leaf->tape_nodes <= 1 && !leaf->grad_wait.bytes)) return leaf_grad(ctx, leaf, dst);
    mp_block *b = leaf->grad_wait.bytes ? &leaf->grad_new : &leaf->grad_wait;
    char label[AG_LABEL_MAX];
    ag_label(label, ag_tensor_name(leaf), "grad_buffer");
    size_t bytes = (size_t)leaf->numel * (size_t)grad_bits(ctx, leaf) / 8;
    if (!ag_alloc_exact(ctx, b, bytes, MP_TEMPORARY, label)) return false;
    dst->fresh = true;
    dst->data = b->data;
    dst->dtype = grad_dtype(ctx, leaf);
    return true;
}

static void add_into(ag_ctx *ctx, const ag_tensor *leaf, void *dst, const void *a, const void *b, int64_t n) {
    if (!dst) return;
    ag_dtype t = grad_dtype(ctx, leaf);
    ag_vec_add((ag_buf){dst, t}, (ag_buf){(void *)a, t}, (ag_buf){(void *)b, t}, n);
}

// After node n's backward: each leaf gradient it wrote beside a waiting one is summed out of
// place (3 leaf-sized buffers at that moment), into .grad when n is the last node to reach the
// leaf, else into the new waiting buffer. A waiting gradient whose last node wrote none becomes
// .grad as it is.
static void leaf_grads_settle(ag_ctx *ctx, ag_node *n) {
    for (int i = 0; i < n->ninputs; i++) {
        if (n->in[i].kind != AG_EDGE_LEAF || !ag_first_edge_to(n, i)) continue;
        ag_tensor *leaf = n->in[i].leaf;
        bool last = leaf->tape_nodes <= 1;
        if (!leaf->grad_wait.bytes || (!leaf->grad_new.bytes && !last)) continue;
        mp_block sum = {0};
        char label[AG_LABEL_MAX];
        ag_label(label, ag_tensor_name(leaf), last ? "grad" : "grad_buffer");
        const size_t bytes = (size_t)leaf->numel * (size_t)grad_bits(ctx, leaf) / 8;
        if (last) {
            leaf->grad = leaf->own_bits
                             ? ag_tensor_new_bits(ctx, leaf->ndim, leaf->shape, MP_GRADIENT, label, leaf->bits)
                             : ag_tensor_like(ctx, leaf, MP_GRADIENT, label);
            if (leaf->grad) sum = leaf->grad->block;
        } else {
            ag_alloc_exact(ctx, &sum, bytes, MP_TEMPORARY, label);
        }
        if (sum.bytes && leaf->grad_new.bytes)
            add_into(ctx, leaf, sum.data, leaf->grad_wait.data, leaf->grad_new.data, leaf->numel);
        else if (sum.data && leaf->grad_wait.data)
            memcpy(sum.data, leaf->grad_wait.data, bytes);
        mp_free(&leaf->grad_new);
        mp_free(&leaf->grad_wait);
        if (!last) leaf->grad_wait = sum;
    }
}

static bool node_grad(ag_ctx *ctx, ag_node *node, ag_grad_dst *dst) {
    if (node->grad.bytes == 0) {
        char label[AG_LABEL_MAX];
        ag_label(label, mp_site_name(node->site), "grad");
        bool ok = AG_FW(ctx->fw, typed_tensors) // a gradient has its tensor's dtype
                      ? ag_alloc_shaped(ctx, &node->grad, node->ndim, node->shape,
                                        ag_type_traits_of(node->grad_dtype)->bits, label)
                      : ag_alloc_block(ctx, &node->grad, (size_t)node->numel * sizeof(float), MP_ACTIVATION, label);
        if (!ok) return false;
        dst->fresh = true;
    }
    dst->data = node->grad.data;
    dst->dtype = node->grad_dtype;
    return true;
}

bool ag_grad_get(ag_ctx *ctx, ag_node *n, int i, ag_grad_dst *dst) {
    *dst = (ag_grad_dst){0};
    switch (n->in[i].kind) {
    case AG_EDGE_NODE: dst->needed = true; return node_grad(ctx, n->in[i].node, dst);
    case AG_EDGE_LEAF:
        dst->needed = true;
        return AG_FW(ctx->fw, leaf_sum_out_of_place) ? leaf_grad_pytorch(ctx, n->in[i].leaf, dst)
                                                     : leaf_grad(ctx, n->in[i].leaf, dst);
    default: return true;
    }
}

static bool same_target(const ag_edge *a, const ag_edge *b) {
    return a->kind != AG_EDGE_NONE && a->kind == b->kind && a->node == b->node && a->leaf == b->leaf;
}

bool ag_grad_get_all(ag_ctx *ctx, ag_node *n, ag_grad_dst *dst) {
    for (int i = 0; i < n->ninputs; i++)
        if (!ag_grad_get(ctx, n, i, &dst[i])) return false;
    // Two inputs with one target (mul(a, a)): the buffer is zeroed once and both accumulate.
    for (int i = 0; i < n->ninputs; i++)
        for (int j = i + 1; j < n->ninputs; j++) {
            if (!same_target(&n->in[i], &n->in[j])) continue;
            if (dst[i].fresh && dst[i].data) {
                int64_t numel = n->in[i].kind == AG_EDGE_NODE ? n->in[i].node->numel : n->in[i].leaf->numel;
                memset(dst[i].data, 0, (size_t)numel * (size_t)ag_type_traits_of(dst[i].dtype)->bits / 8);
            }
            dst[i].fresh = dst[j].fresh = false;
        }
    return true;
}

bool ag_grad_hand_over(ag_ctx *ctx, ag_node *n, int i, mp_block *part) {
    ag_node *to = n->in[i].kind == AG_EDGE_NODE ? n->in[i].node : NULL;
    if (!to) {
        mp_free(part);
        return true;
    }
    if (to->grad.bytes == 0) { // the first gradient to arrive is the buffer itself
        to->grad = *part;
        *part = (mp_block){0};
        return true;
    }
    ag_buf old = {to->grad.data, to->grad_dtype}, add = {part->data, to->grad_dtype};
    if (AG_FW(ctx->fw, node_sum_out_of_place)) { // old + part (1.13), out of place
        mp_block sum = {0};
        char label[AG_LABEL_MAX];
        ag_label(label, mp_site_name(to->site), "grad");
        if (!ag_alloc_shaped(ctx, &sum, to->ndim, to->shape, ag_type_traits_of(to->grad_dtype)->bits, label)) {
            mp_free(part);
            return false;
        }
        if (sum.data) ag_vec_add((ag_buf){sum.data, to->grad_dtype}, old, add, to->numel);
        mp_free(&to->grad);
        to->grad = sum;
    } else if (old.p) {
        ag_vec_acc(old, false, add, to->numel);
    }
    mp_free(part);
    return true;
}

bool ag_grad_pass(ag_node *n, int i) {
    if (n->in[i].kind != AG_EDGE_NODE) return false;
    ag_node *to = n->in[i].node;
    if (to->grad.bytes != 0 || to->numel != n->numel || n->grad.bytes == 0 || to->grad_dtype != n->grad_dtype)
        return false; // another dtype: the engine casts the gradient into a tensor of its own
    to->grad = n->grad;
    n->grad = (mp_block){0};
    return true;
}

// Runs every node above floor, newest first; a node nothing wrote a gradient to is skipped. Each node is
// freed right after its backward, taking its saved tensors and its output gradient with it.
ag_status ag_run_tape_to(ag_ctx *ctx, size_t floor) {
    while (ctx->ntape > floor) {
        ag_node *n = ctx->tape[--ctx->ntape];
        bool run = n->grad.bytes != 0 && ctx->status == AG_OK && ag_hooks_before(ctx, n);
        if (run) n->op->backward(ctx, n, n->grad.data);
        if (AG_FW(ctx->fw, leaf_sum_out_of_place)) { // the engine drops the node's input gradient first
            mp_free(&n->grad);
            leaf_grads_settle(ctx, n);
        }
        ag_tensor *inline_leaves[AG_MAX_INPUTS], **leaves = inline_leaves;
        const bool many = n->ninputs > AG_MAX_INPUTS;
        if (many && !(leaves = malloc((size_t)n->ninputs * sizeof *leaves)))
            ag_fail(ctx, AG_ERR_NOMEM, "backward: out of memory listing the parameters of %s", mp_site_name(n->site));
        int nleaves = 0;
        for (int i = 0; leaves && i < n->ninputs; i++)
            if (n->in[i].kind == AG_EDGE_LEAF && ag_first_edge_to(n, i)) leaves[nleaves++] = n->in[i].leaf;
        ag_node_free(n); // the leaves live on: their owner holds them
        if (leaves && ctx->status == AG_OK) ag_hooks_after(ctx, leaves, nleaves);
        if (many) free(leaves);
    }
    return ctx->status;
}

// Allocates the gradient of `out` for the caller to fill. On any error the tape is dropped, so
// that a failed step still gives its memory back.
static ag_status seed(ag_ctx *ctx, ag_tensor *out) {
    if (ctx->status == AG_OK && !out) ag_fail(ctx, AG_ERR_ARG, "backward: the output tensor is NULL");
    if (ctx->status == AG_OK && !out->node)
        ag_fail(ctx, AG_ERR_STATE,
                "backward: %s has no graph (made in no-grad mode, from inputs needing no "
                "gradient, or backward already ran)",
                ag_tensor_name(out));
    ag_grad_dst d;
    if (ctx->status == AG_OK) node_grad(ctx, out->node, &d);
    if (ctx->status != AG_OK) ag_tape_clear(ctx);
    return ctx->status;
}

ag_status ag_backward(ag_ctx *ctx, ag_tensor *loss) {
    if (!ctx) return AG_ERR_ARG;
    ag_autocast_cache_clear(ctx); // the forward's autocast region has exited
    if (ctx->status == AG_OK && loss && loss->numel != 1)
        ag_fail(ctx, AG_ERR_SHAPE, "backward: %s has %lld elements, expected a scalar loss", ag_tensor_name(loss),
                (long long)loss->numel);
    ag_status st = seed(ctx, loss);
    if (st != AG_OK) return st;
    void *g = loss->node->grad.data;
    if (g) ag_set(g, loss->node->grad_dtype, 0, 1.0f);
    return ag_run_tape_to(ctx, 0);
}

ag_status ag_backward_grad(ag_ctx *ctx, ag_tensor *out, const ag_tensor *grad) {
    if (!ctx) return AG_ERR_ARG;
    ag_autocast_cache_clear(ctx);
    if (ctx->status == AG_OK && out && (!grad || grad->numel != out->numel))
        ag_fail(ctx, AG_ERR_SHAPE, "backward: the gradient of %s must have %lld elements", ag_tensor_name(out),
                (long long)out->numel);
    ag_status st = seed(ctx, out);
    if (st != AG_OK) return st;
    void *g = out->node->grad.data;
    if (g && grad->data) ag_vec_copy((ag_buf){g, out->node->grad_dtype}, ag_buf_of(grad), out->numel);
    return ag_run_tape_to(ctx, 0);
}
