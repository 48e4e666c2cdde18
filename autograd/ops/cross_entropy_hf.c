// cross_entropy under PYTORCH semantics: transformers' ForCausalLMLoss as PyTorch runs it.
// labels = pad(ids, (0, 1), -100); shift = labels[..., 1:].contiguous() (a copy only for B > 1);
// log_softmax over all B*T rows (kept: LogSoftmaxBackward keeps its result, nll_loss its input);
// nll_loss with mean reduction over the B*(T-1) labels that are not -100, keeping total_weight.
// Backward: NllLossBackward's dense [B*T, V] gradient (the labels go with it), then
// LogSoftmaxBackward's, which is the logits' gradient.
#include <math.h>
#include <string.h>

#include "ag_ops.h"

typedef struct {
    float *out;
    const float *in, *grad; // grad: NULL for the forward
    int64_t V;
    bool fresh;
} rows_args;

// Rows [lo, hi): log_softmax, or (grad set) its backward dx = g - e^logp Σ g.
static void rows_part(void *p, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const rows_args *a = p;
    const int64_t V = a->V;
    for (int64_t r = lo; r < hi; r++) {
        const float *x = a->in + r * V;
        float *o = a->out + r * V;
        if (!a->grad) {
            float lse = ag_row_logsumexp(x, V);
            for (int64_t j = 0; j < V; j++) o[j] = x[j] - lse;
            continue;
        }
        const float *gr = a->grad + r * V;
        float sum = 0.0f;
        for (int64_t j = 0; j < V; j++) sum += gr[j];
        for (int64_t j = 0; j < V; j++) {
            float v = gr[j] - expf(x[j]) * sum;
            o[j] = a->fresh ? v : o[j] + v;
        }
    }
}

// The label of row r (b*T + t) in the kept tensor: ids[r + 1], or -100 at a row's last position.
static int64_t label_at(const ag_tensor *lab, int64_t B, int64_t T, int64_t r) {
    const int64_t *l = (const int64_t *)(const void *)lab->data;
    int64_t b = r / T, t = r % T;
    return B == 1 ? l[t + 1] : l[b * T + t];
}

static void hf_backward(ag_ctx *ctx, ag_node *n, const void *dloss) {
    ag_cross_entropy_state *st = &n->state.cross_entropy;
    int64_t B = st->B, T = st->T, V = st->V;
    const bool meta = mp_is_meta();
    mp_block g = {0};
    char label[AG_LABEL_MAX];
    ag_label(label, mp_site_name(n->site), "nll_grad");
    const size_t f32_bytes = (size_t)(B * T * V) * sizeof(float);
    if (!ag_alloc_exact(ctx, &g, f32_bytes, MP_ACTIVATION, label)) return;
    float *gd = (float *)g.data, scale = meta ? 0.0f : ag_get(dloss, n->grad_dtype, 0) / (float)(B * (T - 1));
    if (!meta) {
        memset(gd, 0, (size_t)(B * T * V) * sizeof(float));
        for (int64_t r = 0; r < B * T; r++) {
            int64_t y = label_at(st->labels_t, B, T, r);
            if (y >= 0) gd[r * V + y] = -scale;
        }
    }
    ag_release(st->labels_t); // NllLossBackward releases what it saved
    st->labels_t = NULL;
    if (st->logits_bits < 32) { // LogSoftmaxBackward in float32, then ToCopyBackward
        mp_block lg = {0};
        ag_label(label, mp_site_name(n->site), "log_softmax_grad");
        ag_grad_dst d;
        if (ag_alloc_exact(ctx, &lg, f32_bytes, MP_ACTIVATION, label)) {
            if (!meta)
                ag_parallel_for(B * T, AG_PAR_GRAIN_EXP / V + 1, rows_part,
                                &(rows_args){lg.data, st->logp->data, gd, V, true});
            mp_free(&g);
            if (ag_grad_get(ctx, n, 0, &d) && !meta)
                ag_vec_acc(ag_dst_buf(&d), d.fresh, ag_buf_f32(lg.data), B * T * V);
        }
        mp_free(&lg);
        mp_free(&g);
        return;
    }
    ag_grad_dst d;
    if (ag_grad_get(ctx, n, 0, &d) && !meta) {
        rows_args a = {d.data, st->logp->data, gd, V, d.fresh};
        ag_parallel_for(B * T, AG_PAR_GRAIN_EXP / V + 1, rows_part, &a);
    }
    mp_free(&g);
}

static const ag_op hf_op = {.name = "cross_entropy", .backward = hf_backward, .nsaved = AG_NSAVED(cross_entropy)};

// The labels as ForCausalLMLoss makes them: padded with -100, shifted (copied when B > 1).
static ag_tensor *hf_labels(ag_ctx *ctx, const char *base, const int32_t *ids, int64_t B, int64_t T) {
    char l[AG_LABEL_MAX];
    ag_label(l, base, "labels_padded");
    ag_tensor *pad = ag_tensor_new_f32(ctx, 1, (int64_t[]){2 * B * (T + 1)}, MP_ACTIVATION, l);
    if (pad && !mp_is_meta()) {
        int64_t *p = (int64_t *)(void *)pad->data;
        for (int64_t b = 0; b < B; b++) {
            for (int64_t t = 0; t < T; t++) p[b * (T + 1) + t] = ids[b * T + t];
            p[b * (T + 1) + T] = -100;
        }
    }
    if (!pad || B == 1) return pad;
    ag_label(l, base, "labels");
    ag_tensor *shift = ag_tensor_new_f32(ctx, 1, (int64_t[]){2 * B * T}, MP_ACTIVATION, l);
    if (shift && !mp_is_meta()) {
        const int64_t *p = (const int64_t *)(const void *)pad->data;
        int64_t *s = (int64_t *)(void *)shift->data;
        for (int64_t b = 0; b < B; b++)
            for (int64_t t = 0; t < T; t++) s[b * T + t] = p[b * (T + 1) + t + 1];
    }
    ag_release(pad);
    return shift;
}

ag_tensor *ag_cross_entropy_hf(ag_ctx *ctx, const ag_site *s, ag_tensor *logits, const int32_t *ids, bool rec) {
    int64_t B = logits->shape[0], T = logits->shape[1], V = logits->shape[2];
    const bool meta = mp_is_meta();
    ag_tensor *lab = hf_labels(ctx, s->base, ids, B, T);
    char l[AG_LABEL_MAX];
    ag_label(l, s->base, "logits_float"); // logits.float(): a copy unless they are float32
    ag_tensor *lf = logits->bits < 32 ? ag_tensor_new_bits(ctx, 2, (int64_t[]){B * T, V}, MP_ACTIVATION, l, 32) : NULL;
    ag_label(l, s->base, "log_softmax");
    ag_tensor *logp = ag_tensor_new_bits(ctx, 2, (int64_t[]){B * T, V}, MP_ACTIVATION, l, 32);
    ag_tensor *loss = ag_tensor_new_f32(ctx, 1, (int64_t[]){1}, MP_ACTIVATION, s->out);
    ag_label(l, s->base, "total_weight");
    ag_tensor *tw = ag_tensor_new_f32(ctx, 1, (int64_t[]){1}, MP_ACTIVATION, l);
    ag_tensor *ins[] = {logits};
    ag_node *n = lab && logp && loss && tw && rec ? ag_record(ctx, &hf_op, s->base, loss, 1, ins) : NULL;
    if (!lab || !logp || !loss || !tw || (rec && !n)) {
        ag_release(lab), ag_release(logp), ag_release(loss), ag_release(tw), ag_release(lf);
        return NULL;
    }
    if (!meta) {
        if (lf) ag_vec_copy(ag_buf_of(lf), ag_buf_of(logits), logits->numel);
        ag_parallel_for(B * T, AG_PAR_GRAIN_EXP / V + 1, rows_part,
                        &(rows_args){logp->data, (lf ? lf : logits)->data, NULL, V, false});
        double sum = 0.0; // serial: the same sum in the same order every run
        for (int64_t r = 0; r < B * T; r++) {
            int64_t y = label_at(lab, B, T, r);
            if (y >= 0) sum -= ((const float *)logp->data)[r * V + y];
        }
        *(float *)tw->data = (float)(B * (T - 1));
        *(float *)loss->data = (float)(sum / (double)(B * (T - 1)));
    }
    ag_release(lf); // the float32 copy goes when ForCausalLMLoss returns
    if (!n) {
        ag_release(lab), ag_release(logp), ag_release(tw);
        return loss;
    }
    n->state.cross_entropy = (ag_cross_entropy_state){
        .logp = logp, .labels_t = lab, .total_weight = tw, .B = B, .T = T, .V = V, .logits_bits = logits->bits};
    return loss;
}
