// moe_route: a router's logits to each token's top-k experts and their weights (transformers'
// MixtralSparseMoeBlock and Qwen2/3MoeSparseMoeBlock: softmax in float32, topk, `/=` their sum
// when norm_topk_prob, `.to(hidden_states.dtype)`). Backward: the weights' gradient back through
// the renormalisation, the top-k selection and the softmax to the logits.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ag_ops.h"
#include "kernels/ag_moe.h"

void ag_moe_routing_free(ag_moe_routing *r) {
    if (!r) return;
    free(r->expert);
    free(r->count);
    memset(r, 0, sizeof *r);
}

// Row t: the softmax p[E] and its k largest (sel, first of equal ones), their weights w[k].
// topk_first (gpt_oss): the k largest logits, and p[k] (= w) their softmax.
static void route_row(const float *z, int E, int k, bool renorm, bool topk_first, float *p, int32_t *sel, float *w) {
    if (topk_first) {
        float zk[k];
        ag_moe_topk(z, E, k, sel);
        for (int j = 0; j < k; j++) zk[j] = z[sel[j]];
        ag_moe_softmax_row(zk, k, p);
        memcpy(w, p, (size_t)k * sizeof *w);
        return;
    }
    ag_moe_softmax_row(z, E, p);
    ag_moe_topk(p, E, k, sel);
    float sum = 0.0f;
    for (int j = 0; j < k; j++) sum += (w[j] = p[sel[j]]);
    for (int j = 0; renorm && j < k; j++) w[j] /= sum;
}

// DeepSeek-V3's row: p = sigmoid(z); the groups by their two best choices p + bias; the top-k of
// the choices within the chosen groups (0 elsewhere, as masked_fill leaves them); w = p[sel],
// renormalised, scaled.
static void route_row_group(const float *z, int E, int k, bool renorm, const ag_moe_sigmoid_group *g, float *p,
                            int32_t *sel, float *w) {
    const int G = g->n_group, per = E / G;
    float choice[E], gscore[G];
    for (int e = 0; e < E; e++) {
        p[e] = 1.0f / (1.0f + expf(-z[e]));
        choice[e] = p[e] + (g->bias ? g->bias[e] : 0.0f);
    }
    for (int i = 0; i < G; i++) {
        int32_t two[2];
        ag_moe_topk(choice + i * per, per, 2, two);
        gscore[i] = choice[i * per + two[0]] + choice[i * per + two[1]];
    }
    int32_t groups[G];
    ag_moe_topk(gscore, G, g->topk_group, groups);
    bool keep[G];
    memset(keep, 0, sizeof keep);
    for (int j = 0; j < g->topk_group; j++) keep[groups[j]] = true;
    for (int e = 0; e < E; e++)
        if (!keep[e / per]) choice[e] = 0.0f;
    ag_moe_topk(choice, E, k, sel);
    double sum = 1e-20;
    for (int j = 0; j < k; j++) sum += (w[j] = p[sel[j]]);
    for (int j = 0; j < k; j++) w[j] = (renorm ? (float)(w[j] / sum) : w[j]) * g->scaling;
}

// dz from dw[k] through w = scaling v / (Σ v + 1e-20) (renorm) or scaling v, v = p[sel], p = sigmoid(z).
static void back_row_group(const float *p, const int32_t *sel, const float *dw, int E, int k, bool renorm,
                           float scaling, float *dp) {
    double sum = 1e-20, dot = 0.0;
    for (int j = 0; j < k; j++) sum += p[sel[j]];
    for (int j = 0; j < k; j++) dot += (double)dw[j] * p[sel[j]] / sum;
    memset(dp, 0, (size_t)E * sizeof *dp);
    for (int j = 0; j < k; j++) {
        const float s = p[sel[j]];
        const double dv = renorm ? (dw[j] - dot) / sum : dw[j];
        dp[sel[j]] += (float)(dv * scaling) * s * (1.0f - s);
    }
}

typedef struct {
    ag_buf z, w, p; // p: float32 [N, E] ([N, k] when topk_first)
    int E, k;
    bool renorm, topk_first;
    int32_t *sel;
    const ag_moe_sigmoid_group *group;
} fwd_args;

static void fwd_part(void *arg, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const fwd_args *a = arg;
    float zb[a->E], wv[a->k];
    for (int64_t t = lo; t < hi; t++) {
        const float *z = ag_rd(a->z, t * a->E, a->E, zb);
        const int64_t width = a->topk_first ? a->k : a->E;
        if (a->group)
            route_row_group(z, a->E, a->k, a->renorm, a->group, (float *)a->p.p + t * a->E, a->sel + t * a->k, wv);
        else
            route_row(z, a->E, a->k, a->renorm, a->topk_first, (float *)a->p.p + t * width, a->sel + t * a->k, wv);
        for (int j = 0; j < a->k; j++) ag_set(a->w.p, a->w.t, t * a->k + j, wv[j]);
    }
}

// dz (+)= the gradient of the logits of row t from dw[k]: through w = v / Σv (renorm), v = p[sel],
// p = softmax(z).
static void back_row(const float *p, const int32_t *sel, const float *dw, int E, int k, bool renorm, float *dp) {
    float v[k], dv[k], sum = 0.0f;
    for (int j = 0; j < k; j++) sum += (v[j] = p[sel[j]]);
    double dot = 0.0; // Σ dw_j w_j
    for (int j = 0; j < k; j++) dot += (double)dw[j] * (renorm ? v[j] / sum : v[j]);
    for (int j = 0; j < k; j++) dv[j] = renorm ? (float)((dw[j] - dot) / sum) : dw[j];
    memset(dp, 0, (size_t)E * sizeof *dp);
    for (int j = 0; j < k; j++) dp[sel[j]] += dv[j];
    ag_softmax_backward_row(dp, dp, p, E);
}

typedef struct {
    const float *p;
    const int32_t *sel;
    ag_buf dw, dz;
    bool fresh, renorm, topk_first;
    int E, k;
    bool group;
    float scaling;
} bwd_args;

// topk_first: dz[sel[j]] = p_j (dw_j - Σ p dw), zero elsewhere (p: the k weights).
static void back_row_topk_first(const float *p, const int32_t *sel, const float *dw, int E, int k, float *dp) {
    double dot = 0.0;
    for (int j = 0; j < k; j++) dot += (double)dw[j] * p[j];
    memset(dp, 0, (size_t)E * sizeof *dp);
    for (int j = 0; j < k; j++) dp[sel[j]] = p[j] * (float)(dw[j] - dot);
}

static void bwd_part(void *arg, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const bwd_args *a = arg;
    float dw[a->k], dp[a->E], ob[a->E];
    for (int64_t t = lo; t < hi; t++) {
        for (int j = 0; j < a->k; j++) dw[j] = ag_get(a->dw.p, a->dw.t, t * a->k + j);
        if (a->group)
            back_row_group(a->p + t * a->E, a->sel + t * a->k, dw, a->E, a->k, a->renorm, a->scaling, dp);
        else if (a->topk_first)
            back_row_topk_first(a->p + t * a->k, a->sel + t * a->k, dw, a->E, a->k, dp);
        else
            back_row(a->p + t * a->E, a->sel + t * a->k, dw, a->E, a->k, a->renorm, dp);
        float *o = a->fresh ? ag_wr(a->dz, t * a->E, ob) : ag_rw(a->dz, t * a->E, a->E, ob);
        for (int e = 0; e < a->E; e++) o[e] = a->fresh ? dp[e] : o[e] + dp[e];
        ag_wr_end(a->dz, t * a->E, a->E, o);
    }
}

// PyTorch's nodes between the weights and the logits, as they allocate and free (float32):
// DivBackward (the `/=`: dself, three temporaries of dother's formula, its pre-sum and sum),
// SumBackward (added out of place to dself), TopkBackward (zeros [N, E] scattered), then
// SoftmaxBackward (the logits' gradient, the engine's). Each node's saved tensors go with it.
static bool pytorch_bills(ag_ctx *ctx, ag_node *n, ag_grad_dst *d) {
    ag_moe_route_state *st = &n->state.moe_route;
    const int64_t N = st->N, Nk = N * st->k;
    const char *base = mp_site_name(n->site);
    mp_block a = {0}, t[3] = {{0}}, f = {0}, g = {0}, h = {0};
    if (st->renorm) {
        ag_moe_temp(ctx, &a, base, "grad_values", Nk * 4);
        for (int i = 0; i < 3; i++) ag_moe_temp(ctx, &t[i], base, "grad_div", Nk * 4);
        for (int i = 0; i < 3; i++) mp_free(&t[i]);
        ag_moe_temp(ctx, &t[0], base, "grad_div", Nk * 4);
        ag_moe_temp(ctx, &f, base, "grad_sum", N * 4);
        mp_free(&t[0]);
        mp_free(&n->grad); // the engine drops the weights' gradient after DivBackward
        ag_release(st->clone), st->clone = NULL;
        ag_release(st->sum), st->sum = NULL;
        ag_moe_temp(ctx, &g, base, "grad_values", Nk * 4); // SumBackward's, added out of place
        mp_free(&a);
        mp_free(&f);
    }
    ag_moe_temp(ctx, &h, base, "grad_probs", N * st->E * 4); // TopkBackward's zeros
    mp_free(&g);
    mp_free(&n->grad);
    ag_release(st->indices), st->indices = NULL;
    bool ok = ag_grad_get(ctx, n, 0, d); // SoftmaxBackward's: the logits' gradient
    mp_free(&h);
    return ok;
}

static void route_backward(ag_ctx *ctx, ag_node *n, const void *dout) {
    ag_moe_route_state *st = &n->state.moe_route;
    // the weights' gradient, read before the PyTorch frameworks' bills drop it
    const int64_t Nk = st->N * st->k;
    float *dw = mp_is_meta() ? NULL : malloc((size_t)Nk * sizeof *dw);
    if (!mp_is_meta() && !dw) {
        ag_fail(ctx, AG_ERR_NOMEM, "moe_route %s backward: out of memory", mp_site_name(n->site));
        return;
    }
    for (int64_t i = 0; dw && i < Nk; i++) dw[i] = ag_get(dout, n->grad_dtype, i);
    ag_grad_dst d;
    bool ok = AG_FW(ctx->fw, moe) == AG_MOE_HF_EAGER ? pytorch_bills(ctx, n, &d) : ag_grad_get(ctx, n, 0, &d);
    if (!ok || !d.needed || !dw) {
        free(dw);
        return;
    }
    bwd_args a = {ag_f32(st->probs), st->sel, ag_buf_f32(dw), ag_dst_buf(&d), d.fresh,
                  st->renorm,        st->topk_first, st->E, st->k, st->group, st->scaling};
    ag_parallel_for(st->N, AG_PAR_GRAIN_EXP / st->E + 1, bwd_part, &a);
    free(dw);
}

static void route_release(ag_op_state *s) { free(s->moe_route.sel); }

static const ag_op route_op = {
    .name = "moe_route", .backward = route_backward, .nsaved = AG_NSAVED(moe_route), .release = route_release};

// The routing's counts: measured from sel, or the caller's assumption in meta mode (which must sum
// to N k: every token goes to k experts).
static bool fill_routing(ag_ctx *ctx, const char *base, ag_moe_routing *r, int64_t N, int E, int k, const int32_t *sel,
                         const int64_t *assumed) {
    *r = (ag_moe_routing){.tokens = N, .k = k, .experts = E};
    r->count = calloc((size_t)E, sizeof *r->count);
    if (!r->count) return ag_fail(ctx, AG_ERR_NOMEM, "moe_route %s: out of memory", base);
    if (sel) {
        if (!(r->expert = malloc((size_t)(N * k) * sizeof *r->expert)))
            return ag_fail(ctx, AG_ERR_NOMEM, "moe_route %s: out of memory", base);
        memcpy(r->expert, sel, (size_t)(N * k) * sizeof *sel);
        for (int64_t i = 0; i < N * k; i++) r->count[sel[i]]++;
        return true;
    }
    int64_t sum = 0;
    for (int e = 0; e < E; e++) sum += (r->count[e] = assumed ? assumed[e] : 0);
    if (!assumed)
        ag_moe_balanced(N, E, k, r->count);
    else if (sum != N * k)
        return ag_fail(ctx, AG_ERR_ARG, "moe_route %s: the assumed routing sends %lld pairs, expected %lld x %d", base,
                       (long long)sum, (long long)N, k);
    for (int e = 0; e < E; e++)
        if (r->count[e] < 0 || r->count[e] > N)
            return ag_fail(ctx, AG_ERR_ARG, "moe_route %s: expert %d gets %lld tokens, expected 0 to %lld", base, e,
                           (long long)r->count[e], (long long)N);
    return true;
}

// What PyTorch makes between the logits and the weights, in order: the softmax (after a float32
// copy of 16-bit logits), topk's values (which `/=` then divides in place) and int64 indices, with
// renorm the sum and the clone DivBackward keeps; a 16-bit model casts the values to its dtype.
static bool pytorch_forward(ag_ctx *ctx, const ag_site *s, ag_tensor *logits, const ag_tensor *like, int64_t N, int E,
                            int k, bool renorm, ag_moe_route_state *st, ag_tensor **w) {
    char l[AG_LABEL_MAX];
    ag_tensor *copy = NULL;
    if (logits->bits < 32) {
        ag_label(l, s->base, "logits_float");
        copy = ag_tensor_new_f32(ctx, 2, (int64_t[]){N, E}, MP_ACTIVATION, l);
    }
    ag_label(l, s->base, "probs");
    st->probs = ag_tensor_new_f32(ctx, 2, (int64_t[]){N, E}, MP_ACTIVATION, l);
    ag_release(copy);
    ag_label(l, s->base, "topk_values");
    ag_tensor *values = ag_tensor_new_f32(ctx, 2, (int64_t[]){N, k}, MP_ACTIVATION, like->bits < 32 ? l : s->out);
    st->indices = ag_moe_int64(ctx, s->base, "topk_indices", N * k);
    if (renorm) {
        ag_label(l, s->base, "sum");
        st->sum = ag_tensor_new_f32(ctx, 2, (int64_t[]){N, 1}, MP_ACTIVATION, l);
        ag_label(l, s->base, "values_before_div");
        st->clone = ag_tensor_new_f32(ctx, 2, (int64_t[]){N, k}, MP_ACTIVATION, l);
    }
    *w = values;
    if (values && like->bits < 32) { // .to(hidden_states.dtype): a copy; the float32 values go
        *w = ag_tensor_new_bits(ctx, 2, (int64_t[]){N, k}, MP_ACTIVATION, s->out, like->bits);
        ag_release(values);
    }
    return ctx->status == AG_OK;
}

ag_tensor *ag_moe_route(ag_ctx *ctx, const char *site, ag_tensor *logits, const ag_tensor *like,
                        const ag_moe_route_opts *o, ag_moe_routing *r) {
    ag_tensor *ins[] = {logits};
    if (r) memset(r, 0, sizeof *r);
    if (!ag_check_inputs(ctx, "moe_route", site, 1, ins, (const char *[]){"logits"})) return NULL;
    ag_site s;
    ag_site_parse(&s, site);
    const int E = (int)logits->shape[logits->ndim - 1], k = o ? o->top_k : 0;
    const int64_t N = logits->numel / E;
    if (!like || !r || k < 1 || k > E) {
        ag_fail(ctx, AG_ERR_ARG, "moe_route %s: top-k %d of %d experts (expected 1 to %d; like and routing given)",
                s.base, k, E, E);
        return NULL;
    }
    ag_moe_route_state st = {
        .N = N, .E = E, .k = k, .renorm = o->renorm && !o->topk_first, .topk_first = o->topk_first,
        .group = o->group != NULL, .scaling = o->group ? o->group->scaling : 1.0f};
    ag_tensor *w = NULL;
    const ag_moe_sigmoid_group *g = o->group;
    if (g && (o->topk_first || g->n_group < 1 || E % g->n_group != 0 || E / g->n_group < 2 || g->topk_group < 1 ||
              g->topk_group > g->n_group || g->topk_group * (E / g->n_group) < k)) {
        ag_fail(ctx, AG_ERR_ARG,
                "moe_route %s: %d experts in %d groups, %d of them chosen, top-k %d (expected groups of at least 2 "
                "experts holding at least top-k between the chosen ones)",
                s.base, E, g ? g->n_group : 0, g ? g->topk_group : 0, k);
        return NULL;
    }
    if (g && AG_FW(ctx->fw, moe) == AG_MOE_HF_EAGER) {
        ag_fail(ctx, AG_ERR_ARG,
                "moe_route %s: sigmoid scores with group-limited top-k (deepseek_v3's router) run under the lean "
                "framework only (transformers' DeepseekV3TopkRouter is not modelled op by op)",
                s.base);
        return NULL;
    }
    if (o->topk_first && AG_FW(ctx->fw, moe) == AG_MOE_HF_EAGER) {
        ag_fail(ctx, AG_ERR_ARG,
                "moe_route %s: top-k then softmax (gpt_oss's router) runs under the lean framework only (transformers' "
                "GptOssTopKRouter is not modelled op by op)",
                s.base);
        return NULL;
    }
    if (AG_FW(ctx->fw, moe) == AG_MOE_HF_EAGER) {
        pytorch_forward(ctx, &s, logits, like, N, E, k, o->renorm, &st, &w);
    } else {
        char l[AG_LABEL_MAX];
        ag_label(l, s.base, "probs");
        st.probs = ag_tensor_new_f32(ctx, 2, (int64_t[]){N, o->topk_first ? k : E}, MP_ACTIVATION, l);
        w = st.probs ? ag_tensor_new_bits(ctx, 2, (int64_t[]){N, k}, MP_ACTIVATION, s.out, like->bits) : NULL;
    }
    const bool real = !mp_is_meta();
    if (w && real && !(st.sel = malloc((size_t)(N * k) * sizeof *st.sel)))
        ag_fail(ctx, AG_ERR_NOMEM, "moe_route %s: out of memory", s.base);
    if (w && st.sel) {
        fwd_args a = {ag_buf_of(logits), ag_buf_of(w), ag_buf_of(st.probs), E, k, st.renorm, st.topk_first, st.sel, g};
        ag_parallel_for(N, AG_PAR_GRAIN_EXP / E + 1, fwd_part, &a);
    }
    bool ok = w && ctx->status == AG_OK && fill_routing(ctx, s.base, r, N, E, k, st.sel, o->assumed);
    ag_node *n = ok && ag_any_needs_grad(ctx, 1, ins) ? ag_record(ctx, &route_op, s.base, w, 1, ins) : NULL;
    if (n) {
        n->state.moe_route = st;
        return w;
    }
    for (int i = 0; i < AG_NSAVED(moe_route); i++) ag_release(st.saved[i]);
    free(st.sel);
    if (ok && ctx->status == AG_OK) return w; // nothing to record (no gradient wanted)
    ag_release(w);
    ag_moe_routing_free(r);
    return NULL;
}
