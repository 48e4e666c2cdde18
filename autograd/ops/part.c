// part: a contiguous run of a tensor's elements as a tensor of its own (a fused projection's q, k
// and v, or gate and up: ag_linear_parts lays them out so). A view has no block: it keeps its base
// alive (PyTorch's slice, view and chunk keep the whole storage); a copy has its own.
#include <stdlib.h>
#include <string.h>

#include "ag_ops.h"

static size_t bytes_of(ag_dtype t, int64_t n) { return (size_t)n * (size_t)ag_type_traits_of(t)->bits / 8; }

// Writes dy into the base's gradient at the part's place: into the base's own buffer (zeroed
// where no part was written yet), or (SLICE) into a base-sized gradient of its own, zeros but the
// part, that the engine sums into the base's (SliceBackward's new_zeros and the input buffer).
static void part_backward(ag_ctx *ctx, ag_node *n, const void *dy) {
    const ag_part_state *st = &n->state.part;
    const ag_node *to = n->in[0].kind == AG_EDGE_NODE ? n->in[0].node : NULL;
    ag_buf g = {(void *)dy, n->grad_dtype};
    if (st->kind == AG_PART_SLICE && to) {
        char l[AG_LABEL_MAX];
        ag_label(l, mp_site_name(n->site), "grad");
        mp_block full = {0};
        if (!ag_alloc_shaped(ctx, &full, to->ndim, to->shape, ag_type_traits_of(to->grad_dtype)->bits, l)) return;
        if (full.data) {
            memset(full.data, 0, full.bytes);
            ag_vec_acc((ag_buf){(char *)full.data + bytes_of(to->grad_dtype, st->offset), to->grad_dtype}, true, g,
                       n->numel);
        }
        ag_grad_hand_over(ctx, n, 0, &full);
        return;
    }
    ag_grad_dst d;
    if (!ag_grad_get(ctx, n, 0, &d) || mp_is_meta()) return;
    int64_t total = to ? to->numel : n->in[0].leaf->numel;
    if (d.fresh) memset(d.data, 0, bytes_of(d.dtype, total));
    ag_vec_acc((ag_buf){(char *)d.data + bytes_of(d.dtype, st->offset), d.dtype}, false, g, n->numel);
}

static const ag_op part_op = {.name = "part", .backward = part_backward, .nsaved = 0};

// A tensor of that shape viewing base's elements from offset: no block of its own, base retained.
static ag_tensor *view_new(ag_ctx *ctx, ag_tensor *base, int64_t offset, int ndim, const int64_t *shape,
                           const char *label) {
    ag_tensor *t = ag_tensor_header(ctx, ndim, shape, "tensor", label);
    if (!t) return NULL;
    t->dtype = base->dtype;
    t->bits = base->bits;
    t->data = base->data ? (char *)base->data + bytes_of(base->dtype, offset) : NULL;
    t->block = (mp_block){.category = base->block.category, .site = mp_site_id(label)};
    t->site = t->block.site;
    t->base = ag_retain(base);
    return t;
}

ag_tensor *ag_part(ag_ctx *ctx, const char *site, ag_tensor *base, int64_t offset, int ndim, const int64_t *shape,
                   ag_part_kind kind) {
    ag_tensor *ins[] = {base};
    if (!ag_check_inputs(ctx, "part", site, 1, ins, (const char *[]){"base"})) return NULL;
    ag_site s;
    ag_site_parse(&s, site);
    int64_t numel = 1;
    for (int i = 0; i < ndim && ndim >= 1 && ndim <= AG_MAX_DIMS; i++) numel *= shape[i] > 0 ? shape[i] : -1;
    char sb[64];
    if (ndim < 1 || ndim > AG_MAX_DIMS || numel < 1 || offset < 0 || offset > base->numel - numel ||
        ag_type_traits_of(base->dtype)->quantised) {
        ag_fail(ctx, AG_ERR_SHAPE, "part %s: %lld elements from %lld do not lie in %s %s", s.base, (long long)numel,
                (long long)offset, ag_tensor_name(base), ag_shape_str(base, sb));
        return NULL;
    }
    ag_tensor *y = NULL;
    if (kind == AG_PART_COPY) {
        y = AG_FW(ctx->fw, typed_tensors) ? ag_tensor_new_bits(ctx, ndim, shape, MP_ACTIVATION, s.out, base->bits)
                                          : ag_tensor_new(ctx, ndim, shape, MP_ACTIVATION, s.out);
        if (y && y->data)
            ag_vec_copy(ag_buf_of(y), (ag_buf){(char *)base->data + bytes_of(base->dtype, offset), base->dtype}, numel);
    } else {
        y = view_new(ctx, base, offset, ndim, shape, s.out);
    }
    if (!y || !ag_any_needs_grad(ctx, 1, ins)) return y;
    ag_node *n = ag_record(ctx, &part_op, s.base, y, 1, ins);
    if (!n) {
        ag_release(y);
        return NULL;
    }
    n->state.part = (ag_part_state){.offset = offset, .kind = kind};
    return y;
}
