// What the mixture-of-experts ops share: billed scratch, index tensors, routings.
#include <stdlib.h>
#include <string.h>

#include "ag_moe.h"

bool ag_moe_temp(ag_ctx *ctx, mp_block *b, const char *base, const char *what, int64_t bytes) {
    char l[AG_LABEL_MAX];
    ag_label(l, base, what);
    return ag_alloc_exact(ctx, b, (size_t)bytes, MP_ACTIVATION, l);
}

ag_tensor *ag_moe_int64(ag_ctx *ctx, const char *base, const char *what, int64_t n) {
    char l[AG_LABEL_MAX];
    ag_label(l, base, what);
    return ag_tensor_new_f32(ctx, 1, (int64_t[]){2 * n}, MP_ACTIVATION, l); // two float32 slots an int64
}

void ag_moe_balanced(int64_t N, int E, int k, int64_t *count) {
    const int64_t pairs = N * k;
    for (int e = 0; e < E; e++) count[e] = pairs / E + (e < pairs % E ? 1 : 0);
}

bool ag_moe_group(const ag_moe_routing *r, ag_moe_groups *g) {
    const int E = r->experts, k = r->k;
    const int64_t N = r->tokens;
    g->pair = NULL;
    g->off = calloc((size_t)E + 1, sizeof *g->off);
    if (!g->off) return false;
    for (int e = 0; e < E; e++) g->off[e + 1] = g->off[e] + r->count[e];
    if (!r->expert) return true;
    if (!(g->pair = malloc((size_t)(N * k) * sizeof *g->pair))) {
        ag_moe_groups_free(g);
        return false;
    }
    int64_t *at = malloc((size_t)E * sizeof *at);
    if (!at) {
        ag_moe_groups_free(g);
        return false;
    }
    memcpy(at, g->off, (size_t)E * sizeof *at);
    for (int j = 0; j < k; j++)
        for (int64_t t = 0; t < N; t++) {
            int e = r->expert[t * k + j];
            g->pair[at[e]++] = t * k + j;
        }
    free(at);
    return true;
}

void ag_moe_groups_free(ag_moe_groups *g) {
    free(g->off);
    free(g->pair);
    g->off = NULL;
    g->pair = NULL;
}

void ag_moe_topk(const float *p, int E, int k, int32_t *sel) {
    for (int j = 0; j < k; j++) sel[j] = -1;
    for (int e = 0; e < E; e++) { // insertion into the k kept so far, largest first
        int j = k;
        while (j > 0 && (sel[j - 1] < 0 || p[e] > p[sel[j - 1]])) j--;
        if (j == k) continue;
        memmove(sel + j + 1, sel + j, (size_t)(k - j - 1) * sizeof *sel);
        sel[j] = e;
    }
}

float ag_moe_softmax_row(const float *z, int E, float *p) {
    float mx = z[0];
    for (int e = 1; e < E; e++) mx = z[e] > mx ? z[e] : mx;
    float inv = (float)(1.0 / ag_softmax_exp(p, z, E, mx, NULL));
    for (int e = 0; e < E; e++) p[e] *= inv;
    return mx;
}

bool ag_moe_scratch_new(ag_ctx *ctx, ag_moe_scratch *s, const char *base, const char *what, int64_t numel) {
    const int bits = ctx->dtype.act_bits;
    memset(s, 0, sizeof *s);
    if (!ag_moe_temp(ctx, &s->b, base, what, numel * bits / 8)) return false;
    s->v = (ag_buf){s->b.data, ag_dtype_of_bits(bits, ctx->dtype.fp16)};
    return true;
}

void ag_moe_gather(ag_buf dst, ag_buf src, const int64_t *pair, int64_t n, int k, int64_t H) {
    float b[H];
    for (int64_t i = 0; i < n; i++) {
        const float *r = ag_rd(src, pair[i] / k * H, H, b);
        float *o = ag_wr(dst, i * H, b);
        if (o != r) memcpy(o, r, (size_t)H * sizeof *o);
        ag_wr_end(dst, i * H, H, o);
    }
}

void ag_moe_combine(ag_buf y, ag_buf Y, ag_buf w, const ag_moe_groups *g, int E, int64_t N, int k, int64_t H) {
    float acc[H], yb[H];
    float *sum = calloc((size_t)(N * H), sizeof *sum);
    if (!sum) return;
    for (int e = 0; e < E; e++) // expert after expert, as the eager loop adds them
        for (int64_t i = g->off[e]; i < g->off[e + 1]; i++) {
            int64_t p = g->pair[i], t = p / k;
            float wt = ag_get(w.p, w.t, p);
            const float *r = ag_rd(Y, i * H, H, acc);
            for (int64_t h = 0; h < H; h++) sum[t * H + h] += wt * r[h];
        }
    for (int64_t t = 0; t < N; t++) {
        float *o = ag_wr(y, t * H, yb);
        memcpy(o, sum + t * H, (size_t)H * sizeof *o);
        ag_wr_end(y, t * H, H, o);
    }
    free(sum);
}

void ag_moe_scatter_add(ag_buf dx, bool fresh, ag_buf dxp, const ag_moe_groups *g, int64_t N, int k, int64_t H) {
    if (fresh) memset(dx.p, 0, (size_t)(N * H) * (dx.t == AG_F32 ? 4 : 2));
    float rb[H], ob[H];
    for (int64_t i = 0; i < N * k; i++) {
        int64_t t = g->pair[i] / k;
        const float *v = ag_rd(dxp, i * H, H, rb);
        float *o = ag_rw(dx, t * H, H, ob);
        for (int64_t h = 0; h < H; h++) o[h] += v[h];
        ag_wr_end(dx, t * H, H, o);
    }
}
