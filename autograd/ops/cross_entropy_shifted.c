// cross_entropy as Qwen (v1)'s modeling_qwen.py makes it (QWenLMHeadModel.forward):
//   shift_logits = lm_logits[..., :-1, :].contiguous()   a view at batch 1, a copy otherwise
//   shift_labels = labels[..., 1:].contiguous()          the same for the int64 labels
//   CrossEntropyLoss()(shift_logits.view(-1, V), shift_labels.view(-1))
// in the logits' own dtype: no .float() (transformers' ForCausalLMLoss upcasts; this code does
// not), so under DeepSpeed's fp16 log_softmax's output and both gradients are float16. Under
// torch.autocast, cross_entropy is on the float32 list: the [N, V] rows are cast first.
// Backward: NllLossBackward's dense [N, V] gradient, LogSoftmaxBackward's (then, under autocast,
// ToCopyBackward's at the logits' dtype), and SliceBackward's zeros of the whole [B, T, V] logits
// with the N rows copied in; each node's inputs and saved tensors go before the next one runs.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ag_ops.h"

// The logits' row (b*T + t) that shifted row r (b*(T-1) + t) views.
static int64_t src_row(int64_t r, int64_t T) { return (r / (T - 1)) * T + r % (T - 1); }

typedef struct {
    ag_buf out, in, grad; // grad: NULL data for the forward; in: the logits (forward) or logp
    int64_t T, V;
    bool shifted_in; // in is the whole [B, T, V] logits, read at src_row
} sh_args;

// Rows [lo, hi) of the N shifted rows: log_softmax, or (grad set) its backward g - e^logp Σ g.
static void sh_rows(void *p, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const sh_args *a = p;
    const int64_t V = a->V;
    // row buffers only for 16-bit data (ag_rd and ag_wr hand float32 rows over in place)
    float xb[a->in.t == AG_F32 ? 1 : V], ob[a->out.t == AG_F32 ? 1 : V], gb[a->grad.p && a->grad.t != AG_F32 ? V : 1];
    for (int64_t r = lo; r < hi; r++) {
        const float *x = ag_rd(a->in, (a->shifted_in ? src_row(r, a->T) : r) * V, V, xb);
        float *o = ag_wr(a->out, r * V, ob);
        if (!a->grad.p) {
            float lse = ag_row_logsumexp(x, V);
            for (int64_t j = 0; j < V; j++) o[j] = x[j] - lse;
        } else {
            const float *g = ag_rd(a->grad, r * V, V, gb);
            float sum = 0.0f;
            for (int64_t j = 0; j < V; j++) sum += g[j];
            for (int64_t j = 0; j < V; j++) o[j] = g[j] - expf(x[j]) * sum;
        }
        ag_wr_end(a->out, r * V, V, o);
    }
}

static void sh_release(ag_op_state *st) { free(st->cross_entropy.labels); }

static void sh_backward(ag_ctx *ctx, ag_node *n, const void *dloss) {
    ag_cross_entropy_state *st = &n->state.cross_entropy;
    const int64_t B = st->B, T = st->T, V = st->V, N = B * (T - 1);
    const int bits = st->logp->bits;
    const bool meta = mp_is_meta();
    char l[AG_LABEL_MAX];
    const char *base = mp_site_name(n->site);
    ag_label(l, base, "nll_grad"); // NllLossBackward: zeros, -1/N at each label
    ag_tensor *g = ag_tensor_new_bits(ctx, 2, (int64_t[]){N, V}, MP_ACTIVATION, l, bits);
    if (!g) return;
    if (!meta) {
        float scale = ag_get(dloss, n->grad_dtype, 0) / (float)N;
        memset(g->data, 0, (size_t)(N * V) * (size_t)(bits / 8));
        for (int64_t r = 0; r < N; r++) ag_set(g->data, g->dtype, r * V + st->labels[src_row(r, T) + 1], -scale);
    }
    ag_release(st->labels_t), ag_release(st->total_weight); // NllLossBackward's saved
    st->labels_t = st->total_weight = NULL;
    ag_label(l, base, "log_softmax_grad");
    ag_tensor *lg = ag_tensor_new_bits(ctx, 2, (int64_t[]){N, V}, MP_ACTIVATION, l, bits);
    if (lg && !meta)
        ag_parallel_for(N, AG_PAR_GRAIN_EXP / V + 1, sh_rows,
                        &(sh_args){ag_buf_of(lg), ag_buf_of(st->logp), ag_buf_of(g), T, V, false});
    ag_release(g), ag_release(st->logp); // LogSoftmaxBackward's input and saved result
    st->logp = NULL;
    if (lg && bits > st->logits_bits) { // autocast's cast: ToCopyBackward to the logits' dtype
        ag_label(l, base, "log_softmax_grad_cast");
        ag_tensor *c = ag_tensor_new_bits(ctx, 2, (int64_t[]){N, V}, MP_ACTIVATION, l, st->logits_bits);
        if (c && !meta) ag_vec_copy(ag_buf_of(c), ag_buf_of(lg), N * V);
        ag_release(lg);
        lg = c;
    }
    ag_grad_dst d; // SliceBackward: the whole logits' gradient, the last position of each row zero
    if (lg && ag_grad_get(ctx, n, 0, &d) && !meta) {
        const int64_t es = d.dtype == AG_F32 ? 4 : 2;
        for (int64_t b = 0; b < B; b++) {
            ag_buf dst = ag_buf_at(ag_dst_buf(&d), b * T * V), src = ag_buf_at(ag_buf_of(lg), b * (T - 1) * V);
            ag_vec_acc(dst, d.fresh, src, (T - 1) * V);
            if (d.fresh) memset((char *)dst.p + (T - 1) * V * es, 0, (size_t)(V * es));
        }
    }
    ag_release(lg);
}

static const ag_op sh_op = {
    .name = "cross_entropy", .backward = sh_backward, .nsaved = AG_NSAVED(cross_entropy), .release = sh_release};

ag_tensor *ag_cross_entropy_shifted(ag_ctx *ctx, const ag_site *s, ag_tensor *logits, const int32_t *ids, bool rec) {
    const int64_t B = logits->shape[0], T = logits->shape[1], V = logits->shape[2], N = B * (T - 1);
    const bool meta = mp_is_meta(), cast = ag_autocast(ctx) && logits->bits < 32;
    const int bits = cast ? 32 : logits->bits;
    char l[AG_LABEL_MAX];
    ag_tensor *shift = NULL, *lab = NULL, *in = logits;
    if (B > 1) { // .contiguous() copies a slice that is not one block
        ag_label(l, s->base, "shift_logits");
        shift = ag_tensor_new_bits(ctx, 2, (int64_t[]){N, V}, MP_ACTIVATION, l, logits->bits);
        ag_label(l, s->base, "shift_labels"); // int64, kept by nll_loss
        lab = ag_tensor_new_f32(ctx, 1, (int64_t[]){2 * N}, MP_ACTIVATION, l);
        if (!shift || !lab) goto fail;
        if (!meta)
            for (int64_t b = 0; b < B; b++)
                ag_vec_copy(ag_buf_at(ag_buf_of(shift), b * (T - 1) * V), ag_buf_at(ag_buf_of(logits), b * T * V),
                            (T - 1) * V);
        in = shift;
    }
    ag_tensor *lf = NULL;
    if (cast) { // autocast's float32 cast of the rows, freed once log_softmax has them
        ag_label(l, s->base, "logits_float");
        if (!(lf = ag_tensor_new_bits(ctx, 2, (int64_t[]){N, V}, MP_ACTIVATION, l, 32))) goto fail;
        if (!meta)
            for (int64_t r = 0; r < N; r++)
                ag_vec_copy(ag_buf_at(ag_buf_of(lf), r * V),
                            ag_buf_at(ag_buf_of(in), (in == logits ? src_row(r, T) : r) * V), V);
    }
    ag_label(l, s->base, "log_softmax");
    ag_tensor *logp = ag_tensor_new_bits(ctx, 2, (int64_t[]){N, V}, MP_ACTIVATION, l, bits);
    if (logp && !meta)
        ag_parallel_for(N, AG_PAR_GRAIN_EXP / V + 1, sh_rows,
                        &(sh_args){ag_buf_of(logp), ag_buf_of(lf ? lf : in), {NULL, AG_F32}, T, V, !lf && in == logits});
    ag_release(lf);
    ag_tensor *loss = logp ? ag_tensor_new_bits(ctx, 1, (int64_t[]){1}, MP_ACTIVATION, s->out, bits) : NULL;
    ag_label(l, s->base, "total_weight");
    ag_tensor *tw = loss ? ag_tensor_new_bits(ctx, 1, (int64_t[]){1}, MP_ACTIVATION, l, bits) : NULL;
    ag_node *n = tw && rec ? ag_record(ctx, &sh_op, s->base, loss, 1, (ag_tensor *[]){logits}) : NULL;
    int32_t *keep = n && !meta ? malloc((size_t)(B * T) * sizeof(int32_t)) : NULL;
    if (!tw || (rec && !n) || (n && !meta && !keep)) {
        if (n && !meta && !keep) ag_fail(ctx, AG_ERR_NOMEM, "cross_entropy %s: out of memory for the labels", s->base);
        ag_release(logp), ag_release(loss), ag_release(tw);
        goto fail;
    }
    if (!meta) {
        double sum = 0.0; // serial: the same sum in the same order every run
        for (int64_t r = 0; r < N; r++) sum -= ag_get(logp->data, logp->dtype, r * V + ids[src_row(r, T) + 1]);
        ag_set(tw->data, tw->dtype, 0, (float)N);
        ag_set(loss->data, loss->dtype, 0, (float)(sum / (double)N));
        if (keep) memcpy(keep, ids, (size_t)(B * T) * sizeof(int32_t));
    }
    ag_release(shift); // a local of forward, not saved by any node
    if (!n) {
        ag_release(lab), ag_release(logp), ag_release(tw);
        return loss;
    }
    n->state.cross_entropy = (ag_cross_entropy_state){.logp = logp,
                                                      .labels_t = lab,
                                                      .total_weight = tw,
                                                      .B = B,
                                                      .T = T,
                                                      .V = V,
                                                      .logits_bits = logits->bits,
                                                      .labels = keep};
    return loss;
fail:
    ag_release(shift), ag_release(lab);
    return NULL;
}
