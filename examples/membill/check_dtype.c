// How far a dtype moves a generation from float32's, for check's Q and B claims: the same random
// weights (made in float32, then rounded or quantised), a greedy generation in each, and the
// next-token distributions of both models along float32's text (each position's logits from one
// forward over the prompt and float32's new tokens).
#include "cli.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

// Softmax rows of logits[rows, V] into p (float64: the KL of near-uniform distributions is tiny).
static void softmax_rows(const ag_tensor *logits, int64_t first, int64_t rows, double *p, float *row) {
    int64_t V = logits->shape[2];
    for (int64_t r = 0; r < rows; r++) {
        ag_tensor_row_f32(logits, first + r, row);
        double mx = row[0], sum = 0.0;
        for (int64_t j = 1; j < V; j++) mx = row[j] > mx ? row[j] : mx;
        for (int64_t j = 0; j < V; j++) sum += (p[r * V + j] = exp((double)row[j] - mx));
        for (int64_t j = 0; j < V; j++) p[r * V + j] /= sum;
    }
}

// The probabilities of every new token's position ([N, V]) under the model in dt, along seq
// (T prompt ids and N new ones: positions T - 1 .. T + N - 2 predict them).
static double *distributions(const llama_config *c, const char *st_path, const cli_dtype *dt, const int32_t *seq,
                             long T, long N, ag_err *err) {
    if (mp_init(&(mp_options){0}) != MP_OK) {
        ag_err_set(err, "check: the profiler is already running");
        return NULL;
    }
    ag_ctx *ctx = ag_ctx_new();
    llama_model *m = NULL;
    double *p = NULL;
    float *row = malloc((size_t)c->vocab * sizeof *row);
    if (ctx && row && cli_model_build(ctx, c, dt, st_path, 0, &m, err) == 0) { // check's generations: seed 0
        ag_set_grad_enabled(ctx, false);
        ag_tensor *logits = llama_forward_logits(ctx, m, seq, 1, T + N - 1, err);
        if (logits && (p = malloc((size_t)(N * c->vocab) * sizeof *p))) softmax_rows(logits, T - 1, N, p, row);
        if (logits && !p) ag_err_set(err, "check: out of memory for %ld distributions", N);
        ag_release(logits);
    } else if (!ctx || !row) {
        ag_err_set(err, "check: out of memory");
    }
    llama_model_free(m);
    ag_ctx_free(ctx);
    free(row);
    mp_shutdown();
    return p;
}

int cli_dtype_compare(const llama_config *c, const char *st_path, long T, long N, const cli_dtype *dt,
                      const int32_t *prompt, const int32_t *ref_new, const int32_t *new_ids, cli_dtype_outcome *out,
                      ag_err *err) {
    memset(out, 0, sizeof *out);
    int32_t *seq = malloc((size_t)(T + N) * sizeof *seq);
    if (!seq) {
        ag_err_set(err, "check: out of memory");
        return -1;
    }
    memcpy(seq, prompt, (size_t)T * sizeof *seq);
    memcpy(seq + T, ref_new, (size_t)N * sizeof *seq);
    cli_dtype f32;
    cli_parse_dtype("fp32", &f32);
    double *p = distributions(c, st_path, &f32, seq, T, N, err),
           *q = p ? distributions(c, st_path, dt, seq, T, N, err) : NULL;
    free(seq);
    if (!q) {
        free(p);
        return -1;
    }
    const int64_t V = c->vocab;
    long agree = 0;
    double kl = 0.0;
    for (long r = 0; r < N; r++) {
        const double *pr = p + r * V, *qr = q + r * V;
        int64_t ap = 0, aq = 0;
        for (int64_t j = 0; j < V; j++) {
            if (pr[j] > pr[ap]) ap = j;
            if (qr[j] > qr[aq]) aq = j;
            if (pr[j] > 0) kl += pr[j] * (log(pr[j]) - log(qr[j] > 1e-300 ? qr[j] : 1e-300));
        }
        agree += ap == aq;
        if (r == 0) out->p_ref = pr[ap], out->p = qr[ap];
    }
    out->top1 = (double)agree / (double)N;
    out->kl = kl / (double)N;
    out->diverge = -1;
    for (long r = 0; r < N && out->diverge < 0; r++)
        if (new_ids[r] != ref_new[r]) out->diverge = r;
    free(p);
    free(q);
    return 0;
}
