// gelu_tanh: y = x/2 (1 + tanh(k (x + 0.044715 x³))), k = sqrt(2/π): PyTorch's
// gelu(approximate="tanh") (transformers' gelu_pytorch_tanh, Gemma's MLP).
#include <math.h>

#include "ag_ops.h"

#define GELU_K 0.7978845608028654f // sqrt(2 / pi)
#define GELU_C 0.044715f

typedef struct {
    ag_buf out, x, dy; // dy.p: NULL in forward
    bool fresh;
} gelu_args;

static void gelu_part(void *p, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const gelu_args *a = p;
    float xb[AG_BLK], gb[AG_BLK], ob[AG_BLK];
    for (int64_t i = lo; i < hi; i += AG_BLK) {
        int64_t n = hi - i < AG_BLK ? hi - i : AG_BLK;
        const float *x = ag_rd(a->x, i, n, xb), *dy = a->dy.p ? ag_rd(a->dy, i, n, gb) : NULL;
        float *o = dy && !a->fresh ? ag_rw(a->out, i, n, ob) : ag_wr(a->out, i, ob);
        for (int64_t j = 0; j < n; j++) {
            float v = x[j], t = tanhf(GELU_K * (v + GELU_C * v * v * v));
            if (!dy) {
                o[j] = 0.5f * v * (1.0f + t);
                continue;
            }
            float g = dy[j] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * GELU_K * (1.0f + 3.0f * GELU_C * v * v));
            o[j] = a->fresh ? g : o[j] + g;
        }
        ag_wr_end(a->out, i, n, o);
    }
}

// Backward needs x (GeluBackward keeps its input too).
static void gelu_backward(ag_ctx *ctx, ag_node *n, const void *dy) {
    ag_grad_dst d;
    if (!ag_grad_get(ctx, n, 0, &d) || !d.needed || mp_is_meta()) return;
    gelu_args a = {ag_dst_buf(&d), ag_buf_of(n->state.silu.x), {(void *)dy, n->grad_dtype}, d.fresh};
    ag_parallel_for(n->numel, AG_PAR_GRAIN_EXP, gelu_part, &a);
}

// The state is silu's: the input alone.
static const ag_op gelu_op = {.name = "gelu_tanh", .backward = gelu_backward, .nsaved = AG_NSAVED(silu)};

ag_tensor *ag_gelu_tanh(ag_ctx *ctx, const char *site, ag_tensor *x) {
    ag_tensor *ins[] = {x};
    if (!ag_check_inputs(ctx, "gelu_tanh", site, 1, ins, (const char *[]){"x"})) return NULL;
    ag_site s;
    ag_site_parse(&s, site);
    ag_tensor *y = ag_tensor_like(ctx, x, MP_ACTIVATION, s.out);
    if (!y) return NULL;
    if (!mp_is_meta()) {
        gelu_args a = {ag_buf_of(y), ag_buf_of(x), {0}, false};
        ag_parallel_for(x->numel, AG_PAR_GRAIN_EXP, gelu_part, &a);
    }
    if (!ag_any_needs_grad(ctx, 1, ins)) return y;
    ag_node *n = ag_record(ctx, &gelu_op, s.base, y, 1, ins);
    if (!n) {
        ag_release(y);
        return NULL;
    }
    n->state.silu.x = ag_retain(x);
    return y;
}
