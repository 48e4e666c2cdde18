// sigmoid_gate: y[N, C] = sigmoid(g[N, 1]) * x[N, C] (qwen2_moe: F.sigmoid(shared_expert_gate(x)) *
// shared_expert_output). PyTorch makes the sigmoid [N, 1] (SigmoidBackward keeps it) and the
// product (MulBackward keeps both factors).
#include <math.h>
#include <string.h>

#include "ag_ops.h"

static void sigmoid_gate_backward(ag_ctx *ctx, ag_node *n, const void *dout) {
    const ag_sigmoid_gate_state *st = &n->state.sigmoid_gate;
    const int64_t N = st->N, C = st->C;
    ag_buf dy = {(void *)dout, n->grad_dtype};
    ag_grad_dst dg, dx;
    mp_block whole = {0}, dsig = {0};
    const char *base = mp_site_name(n->site);
    char l[AG_LABEL_MAX];
    if (!ag_grad_get(ctx, n, 1, &dx)) return; // MulBackward: d(x) = dy sig first
    if (dx.needed && !mp_is_meta()) ag_rows_scale(ag_dst_buf(&dx), dx.fresh, dy, ag_buf_of(st->sig), N, C);
    if (n->in[0].kind == AG_EDGE_NONE) return;
    if (AG_FW(ctx->fw, moe) == AG_MOE_HF_EAGER) { // dy x whole, its sum [N, 1] (SigmoidBackward's input), then its own
        ag_label(l, base, "grad_gate_whole");
        int bits = ag_type_traits_of(n->grad_dtype)->bits;
        if (!ag_alloc_shaped(ctx, &whole, 2, (int64_t[]){N, C}, bits, l)) return;
        ag_label(l, base, "grad_sigmoid");
        bool ok = ag_alloc_shaped(ctx, &dsig, 2, (int64_t[]){N, 1}, bits, l);
        mp_free(&whole);
        if (!ok) return;
    }
    if (ag_grad_get(ctx, n, 0, &dg) && dg.needed && !mp_is_meta())
        for (int64_t i = 0; i < N; i++) {
            const float s = ag_get(st->sig->data, st->sig->dtype, i);
            const float v = ag_row_dot(dy, ag_buf_of(st->x), i, C) * s * (1.0f - s);
            ag_set(dg.data, dg.dtype, i, dg.fresh ? v : ag_get(dg.data, dg.dtype, i) + v);
        }
    mp_free(&dsig);
}

static const ag_op sigmoid_gate_op = {
    .name = "sigmoid_gate", .backward = sigmoid_gate_backward, .nsaved = AG_NSAVED(sigmoid_gate)};

ag_tensor *ag_sigmoid_gate(ag_ctx *ctx, const char *site, ag_tensor *g, ag_tensor *x) {
    ag_tensor *ins[] = {g, x};
    if (!ag_check_inputs(ctx, "sigmoid_gate", site, 2, ins, (const char *[]){"g", "x"})) return NULL;
    ag_site s;
    ag_site_parse(&s, site);
    const int64_t C = x->shape[x->ndim - 1], N = x->numel / C;
    if (g->numel != N) {
        char a[64], b[64];
        ag_fail(ctx, AG_ERR_SHAPE, "sigmoid_gate %s: g %s and x %s (expected one gate a row)", s.base,
                ag_shape_str(g, a), ag_shape_str(x, b));
        return NULL;
    }
    char l[AG_LABEL_MAX];
    ag_label(l, s.base, "sigmoid");
    ag_tensor *sig = ag_tensor_like(ctx, g, MP_ACTIVATION, l);
    ag_tensor *y = sig ? ag_tensor_promoted(ctx, x, sig, s.out) : NULL;
    if (!y) {
        ag_release(sig);
        return NULL;
    }
    if (!mp_is_meta()) {
        for (int64_t i = 0; i < N; i++) // the gate as rounded to its dtype scales the row
            ag_set(sig->data, sig->dtype, i, 1.0f / (1.0f + expf(-ag_get(g->data, g->dtype, i))));
        ag_rows_scale(ag_buf_of(y), true, ag_buf_of(x), ag_buf_of(sig), N, C);
    }
    ag_node *n = ag_any_needs_grad(ctx, 2, ins) ? ag_record(ctx, &sigmoid_gate_op, s.base, y, 2, ins) : NULL;
    if (!n) {
        ag_release(sig);
        if (ctx->status != AG_OK) ag_release(y), y = NULL;
        return y;
    }
    n->state.sigmoid_gate = (ag_sigmoid_gate_state){.sig = sig, .x = ag_retain(x), .N = N, .C = C};
    return y;
}
