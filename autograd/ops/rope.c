// rope: rotary position embedding, HF rotate_half convention. For each head and i < hd/2,
// with a = pos * inv_freq[i], inv_freq[i] = 1 / theta^(2i/hd):
//   y[i]        = x[i] cos a - x[i + hd/2] sin a
//   y[i + hd/2] = x[i + hd/2] cos a + x[i] sin a
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ag_ops.h"

// y = R(±a) x over x[B, T, nh*hd]; `accumulate` adds into y. Angles are formed in float32
// as HF does (inv_freq in float32, one float product with the position), so results match it.
typedef struct {
    ag_buf y, x;
    const int32_t *pos;
    int64_t T, pos0;
    int nh, hd;
    float sign;
    bool accumulate;
    float scale; // the attention scaling some rope_scaling types fold into cos and sin
    float inv_freq[AG_ROPE_MAX_HEAD_DIM / 2];
} rope_args;

static void rotate_part(void *p, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const rope_args *ra = p;
    const int half = ra->hd / 2;
    const int64_t width = (int64_t)ra->nh * ra->hd;
    for (int64_t r = lo; r < hi; r++) {
        float c[AG_ROPE_MAX_HEAD_DIM / 2], s[AG_ROPE_MAX_HEAD_DIM / 2];
        float p = (float)(ra->pos ? ra->pos[r] : ra->pos0 + r % ra->T);
        for (int i = 0; i < half; i++) {
            float a = p * ra->inv_freq[i];
            c[i] = (float)cos((double)a) * ra->scale;
            s[i] = (float)sin((double)a) * ra->scale;
        }
        float xb[width], yb[width];
        float *y = ra->accumulate ? ag_rw(ra->y, r * width, width, yb) : ag_wr(ra->y, r * width, yb);
        ag_rope_row(y, ag_rd(ra->x, r * width, width, xb), c, s, c, s, ra->nh, ra->hd, ra->sign, ra->accumulate);
        ag_wr_end(ra->y, r * width, width, y);
    }
}

static void rope_rotate(ag_buf y, bool accumulate, ag_buf x, int64_t B, int64_t T, int nh, int hd,
                        const ag_rope_freqs *f, const int32_t *pos, int64_t pos0, float sign) {
    rope_args a = {y, x, pos, T, pos0, nh, hd, sign, accumulate, ag_rope_scale(f), {0}};
    for (int i = 0; i < hd / 2; i++) a.inv_freq[i] = ag_rope_freq_at(f, i, hd);
    ag_parallel_for(B * T, AG_PAR_GRAIN / ((int64_t)nh * hd) + 1, rotate_part, &a);
}

// A rotation's gradient is the inverse rotation: backward saves nothing and recomputes the
// angles from the positions (pos0, or the copied per-row positions).
static void rope_backward(ag_ctx *ctx, ag_node *n, const void *dy) {
    const ag_rope_state *st = &n->state.rope;
    ag_grad_dst d;
    if (!ag_grad_get(ctx, n, 0, &d) || mp_is_meta()) return;
    rope_rotate(ag_dst_buf(&d), !d.fresh, (ag_buf){(void *)dy, n->grad_dtype}, st->B, st->T, st->heads, st->head_dim,
                &st->freqs, st->pos, st->pos0, -1.0f);
}

static void rope_release(ag_op_state *st) { free(st->rope.pos); }

static const ag_op rope_op = {.name = "rope", .backward = rope_backward, .release = rope_release};

static ag_tensor *rope(ag_ctx *ctx, const char *site, ag_tensor *x, int nh, int hd, const ag_rope_freqs *f,
                       const int32_t *pos, int64_t pos0) {
    ag_tensor *ins[] = {x};
    if (!ag_check_inputs(ctx, "rope", site, 1, ins, (const char *[]){"x"})) return NULL;
    ag_site s;
    ag_site_parse(&s, site);
    char sx[64];
    if (x->ndim != 3 || nh < 1 || hd < 2 || hd % 2 || hd > AG_ROPE_MAX_HEAD_DIM || x->shape[2] != (int64_t)nh * hd ||
        !ag_rope_freqs_ok(f, hd)) {
        ag_fail(ctx, AG_ERR_SHAPE,
                "rope %s: x %s does not fit %d heads of dimension %d "
                "(expected [B, T, %lld], head dimension even and at most %d, theta and frequencies > 0)",
                s.base, ag_shape_str(x, sx), nh, hd, (long long)nh * hd, AG_ROPE_MAX_HEAD_DIM);
        return NULL;
    }
    int64_t B = x->shape[0], T = x->shape[1];
    ag_tensor *y = ag_tensor_like(ctx, x, MP_ACTIVATION, s.out);
    if (!y) return NULL;
    if (!mp_is_meta()) rope_rotate(ag_buf_of(y), false, ag_buf_of(x), B, T, nh, hd, f, pos, pos0, 1.0f);
    if (!ag_any_needs_grad(ctx, 1, ins)) return y;
    ag_node *n = ag_record(ctx, &rope_op, s.base, y, 1, ins);
    ag_rope_state *sn = n ? &n->state.rope : NULL;
    if (sn && pos && !(sn->pos = malloc((size_t)(B * T) * sizeof(int32_t))))
        ag_fail(ctx, AG_ERR_NOMEM, "rope %s: out of memory for the positions", s.base);
    if (!n || ctx->status != AG_OK) {
        ag_release(y);
        return NULL;
    }
    if (pos) memcpy(sn->pos, pos, (size_t)(B * T) * sizeof(int32_t));
    sn->B = B, sn->T = T, sn->pos0 = pos0;
    sn->heads = nh, sn->head_dim = hd, sn->freqs = *f;
    return y;
}

ag_tensor *ag_rope_f(ag_ctx *ctx, const char *site, ag_tensor *x, int nh, int hd, const ag_rope_freqs *f,
                     int64_t pos0) {
    return rope(ctx, site, x, nh, hd, f, NULL, pos0);
}

ag_tensor *ag_rope_positions_f(ag_ctx *ctx, const char *site, ag_tensor *x, int nh, int hd, const ag_rope_freqs *f,
                               const int32_t *pos) {
    if (ctx && ctx->status == AG_OK && !pos && !mp_is_meta()) { // meta mode has no positions
        ag_fail(ctx, AG_ERR_ARG, "rope %s: positions are NULL", site ? site : "");
        return NULL;
    }
    return rope(ctx, site, x, nh, hd, f, pos, 0);
}

ag_tensor *ag_rope(ag_ctx *ctx, const char *site, ag_tensor *x, int nh, int hd, float theta, int64_t pos0) {
    return ag_rope_f(ctx, site, x, nh, hd, &(ag_rope_freqs){theta, NULL, 1.0f}, pos0);
}

ag_tensor *ag_rope_positions(ag_ctx *ctx, const char *site, ag_tensor *x, int nh, int hd, float theta,
                             const int32_t *pos) {
    return ag_rope_positions_f(ctx, site, x, nh, hd, &(ag_rope_freqs){theta, NULL, 1.0f}, pos);
}
