// cross_entropy: next-token loss of logits[B, T, V] against ids[B*T], as HF labels=input_ids:
// position t of row b predicts ids[b*T + t + 1]; loss = mean over the B*(T-1) positions of
// logsumexp(logits) - logits[label]. The last position of each row predicts nothing.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ag_ops.h"

#if defined(__x86_64__)
// dlogits of one row: e^(x - lse) * scale, written or added.
AG_AVX512 static void row_grad_avx512(float *g, const float *x, float lse, float scale, int64_t V, bool fresh) {
    __m512 m = _mm512_set1_ps(lse), sc = _mm512_set1_ps(scale);
    for (int64_t j = 0; j < V; j += 16) {
        __mmask16 mk = ag_mask16(V - j);
        __m512 e = ag_exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, x + j), m));
        __m512 v = _mm512_mul_ps(e, sc);
        if (!fresh) v = _mm512_add_ps(_mm512_maskz_loadu_ps(mk, g + j), v);
        _mm512_mask_storeu_ps(g + j, mk, v);
    }
}
#endif

typedef struct {
    float *out;        // lse_part
    ag_buf dl, logits; // dl: grad_part's output
    const float *lse;
    const int32_t *labels;
    int64_t T, V;
    float scale;
    bool fresh;
} ce_args;

static void lse_part(void *p, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const ce_args *c = p;
    const int64_t T = c->T, V = c->V;
    float xb[c->logits.t == AG_F32 ? 1 : V];
    for (int64_t r = lo; r < hi; r++)
        c->out[r] = ag_row_logsumexp(ag_rd(c->logits, ((r / (T - 1)) * T + r % (T - 1)) * V, V, xb), V);
}

// lse[b*(T-1) + t] for every predicting position.
static void row_logsumexp(float *lse, ag_buf logits, int64_t B, int64_t T, int64_t V) {
    ce_args c = {.out = lse, .logits = logits, .T = T, .V = V};
    ag_parallel_for(B * (T - 1), AG_PAR_GRAIN_EXP / V + 1, lse_part, &c);
}

// dlogits of one row: e^(x - lse) * scale, written or added.
static void row_grad(float *g, const float *x, float m, float scale, int64_t V, bool fresh) {
#if defined(__x86_64__)
    if (ag_has_avx512()) {
        row_grad_avx512(g, x, m, scale, V, fresh);
        return;
    }
#endif
    for (int64_t j = 0; j < V; j++) {
        float v = expf(x[j] - m) * scale;
        g[j] = fresh ? v : g[j] + v;
    }
}

static void grad_part(void *p, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const ce_args *c = p;
    const int64_t T = c->T, V = c->V;
    const bool f32 = c->dl.t == AG_F32 && c->logits.t == AG_F32;
    float gb[f32 ? 1 : V], xb[f32 ? 1 : V];
    for (int64_t r = lo; r < hi; r++) {
        int64_t t = r % T;
        float *g = c->fresh ? ag_wr(c->dl, r * V, gb) : ag_rw(c->dl, r * V, V, gb);
        if (t == T - 1) {
            if (c->fresh) memset(g, 0, (size_t)V * sizeof(float));
        } else {
            row_grad(g, ag_rd(c->logits, r * V, V, xb), c->lse[(r / T) * (T - 1) + t], c->scale, V, c->fresh);
            g[c->labels[r + 1]] -= c->scale;
        }
        ag_wr_end(c->dl, r * V, V, g);
    }
}

// Backward needs the logits (kept by reference: the output head's result, not a copy), the
// per-position logsumexp (one float each, instead of a second pass over V) and the labels
// (copied into the node). dlogits = (softmax - onehot) * dloss / N; zero at last positions.
static void cross_entropy_backward(ag_ctx *ctx, ag_node *n, const void *dloss) {
    const ag_cross_entropy_state *st = &n->state.cross_entropy;
    int64_t B = st->B, T = st->T, V = st->V;
    ag_grad_dst d;
    if (!ag_grad_get(ctx, n, 0, &d) || mp_is_meta()) return;
    float dl = ag_get(dloss, n->grad_dtype, 0) / (float)(B * (T - 1));
    ce_args c = {NULL, ag_dst_buf(&d), ag_buf_of(st->logits), st->lse->data, st->labels, T, V, dl, d.fresh};
    ag_parallel_for(B * T, AG_PAR_GRAIN_EXP / V + 1, grad_part, &c);
}

static void cross_entropy_release(ag_op_state *st) { free(st->cross_entropy.labels); }

static const ag_op cross_entropy_op = {.name = "cross_entropy",
                                       .backward = cross_entropy_backward,
                                       .nsaved = AG_NSAVED(cross_entropy),
                                       .release = cross_entropy_release};

static float mean_loss(const float *lse, ag_buf logits, const int32_t *ids, int64_t B, int64_t T, int64_t V) {
    double sum = 0.0; // serial: the same sum in the same order every run
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T - 1; t++) {
            int64_t r = b * T + t;
            sum += (double)lse[b * (T - 1) + t] - ag_get(logits.p, logits.t, r * V + ids[r + 1]);
        }
    return (float)(sum / (double)(B * (T - 1)));
}

static bool ce_check(ag_ctx *ctx, const char *base, const ag_tensor *logits, const int32_t *ids) {
    char sl[64];
    bool meta = mp_is_meta(); // meta mode reads no labels
    if (logits->ndim != 3 || logits->shape[1] < 2 || (!ids && !meta)) {
        ag_fail(ctx, AG_ERR_SHAPE,
                "cross_entropy %s: expected logits [B, T >= 2, V] and ids, "
                "got %s %s%s",
                base, ag_tensor_name(logits), ag_shape_str(logits, sl), ids ? "" : " and no ids");
        return false;
    }
    int64_t BT = logits->shape[0] * logits->shape[1], V = logits->shape[2];
    for (int64_t r = 0; !meta && r < BT; r++)
        if (ids[r] < 0 || ids[r] >= V) {
            ag_fail(ctx, AG_ERR_ARG,
                    "cross_entropy %s: label %d at position %lld is outside "
                    "[0, %lld)",
                    base, ids[r], (long long)r, (long long)V);
            return false;
        }
    return true;
}

ag_tensor *ag_cross_entropy(ag_ctx *ctx, const char *site, ag_tensor *logits, const int32_t *ids) {
    ag_tensor *ins[] = {logits};
    if (!ag_check_inputs(ctx, "cross_entropy", site, 1, ins, (const char *[]){"logits"})) return NULL;
    ag_site s;
    ag_site_parse(&s, site);
    if (!ce_check(ctx, s.base, logits, ids)) return NULL;
    switch (AG_FW(ctx->fw, loss)) {
    case AG_LOSS_HF: return ag_cross_entropy_hf(ctx, &s, logits, ids, ag_any_needs_grad(ctx, 1, ins));
    case AG_LOSS_SHIFTED: return ag_cross_entropy_shifted(ctx, &s, logits, ids, ag_any_needs_grad(ctx, 1, ins));
    case AG_LOSS_FUSED: break;
    }
    int64_t B = logits->shape[0], T = logits->shape[1], V = logits->shape[2], N = B * (T - 1);
    char label[AG_LABEL_MAX];
    ag_label(label, s.base, "lse");
    ag_tensor *loss = ag_tensor_new(ctx, 1, (int64_t[]){1}, MP_ACTIVATION, s.out);
    ag_tensor *lse = ag_tensor_new_f32(ctx, 1, &N, MP_ACTIVATION, label);
    ag_node *n = NULL;
    if (loss && lse && ag_any_needs_grad(ctx, 1, ins)) {
        n = ag_record(ctx, &cross_entropy_op, s.base, loss, 1, ins);
        if (n && !mp_is_meta() && !(n->state.cross_entropy.labels = malloc((size_t)(B * T) * sizeof(int32_t))))
            ag_fail(ctx, AG_ERR_NOMEM, "cross_entropy %s: out of memory for the labels", s.base);
    }
    if (!loss || !lse || ctx->status != AG_OK) {
        ag_release(lse);
        ag_release(loss);
        return NULL;
    }
    if (!mp_is_meta()) {
        row_logsumexp(lse->data, ag_buf_of(logits), B, T, V);
        ag_set(loss->data, loss->dtype, 0, mean_loss(lse->data, ag_buf_of(logits), ids, B, T, V));
    }
    if (n) {
        ag_cross_entropy_state *st = &n->state.cross_entropy;
        if (!mp_is_meta()) memcpy(st->labels, ids, (size_t)(B * T) * sizeof(int32_t));
        st->logits = ag_retain(logits);
        st->lse = ag_retain(lse);
        st->B = B, st->T = T, st->V = V;
    }
    ag_release(lse); // the node holds it; without one it was only needed for the mean
    return loss;
}
