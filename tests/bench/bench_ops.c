// Forward and backward time of each autograd op at SmolLM2-135M shapes (hidden 576,
// intermediate 1536, 9 heads, 3 key-value heads, head dim 64, vocab 49152), for 25 and 512
// tokens, with the share of that time spent in sgemm. Usage: bench_ops [reps] [tokens...]
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "autograd.h"
#include "bench_util.h"

enum { HID = 576, INTER = 1536, HQ = 9, HKV = 3, HD = 64, VOCAB = 49152 };

// The inputs of one op: leaves that want gradients (parameters, or activations standing for
// the outputs of earlier ops), made once and reused by every repetition.
typedef struct {
    ag_ctx *ctx;
    int64_t T;
    ag_tensor *in[3];
    int nin;
    int32_t *ids;
} bench_case;

static void add_leaf(bench_case *c, int ndim, const int64_t *shape, mp_category cat) {
    ag_tensor *t = bench_checked("bench_ops", c->ctx, ag_tensor_new(c->ctx, ndim, shape, cat, "bench:input"));
    t->requires_grad = true;
    for (int64_t i = 0; i < t->numel; i++) ag_f32(t)[i] = 0.1f * (bench_uniform() - 0.5f);
    c->in[c->nin++] = t;
}

static void activation(bench_case *c, int64_t width) { add_leaf(c, 3, (int64_t[]){1, c->T, width}, MP_ACTIVATION); }

static void weight(bench_case *c, int64_t rows, int64_t cols) {
    if (cols)
        add_leaf(c, 2, (int64_t[]){rows, cols}, MP_WEIGHT);
    else
        add_leaf(c, 1, (int64_t[]){rows}, MP_WEIGHT);
}

// Each op: `make` creates the inputs (first call), then the op runs on them.
static ag_tensor *linear(bench_case *c, bool make, int64_t in, int64_t out) {
    if (make) {
        activation(c, in);
        weight(c, out, in);
    }
    return ag_linear(c->ctx, "linear", c->in[0], c->in[1], NULL);
}

static ag_tensor *op_q_proj(bench_case *c, bool make) { return linear(c, make, HID, HQ * HD); }
static ag_tensor *op_k_proj(bench_case *c, bool make) { return linear(c, make, HID, HKV * HD); }
static ag_tensor *op_gate(bench_case *c, bool make) { return linear(c, make, HID, INTER); }
static ag_tensor *op_down(bench_case *c, bool make) { return linear(c, make, INTER, HID); }
static ag_tensor *op_lm_head(bench_case *c, bool make) { return linear(c, make, HID, VOCAB); }

static ag_tensor *op_embedding(bench_case *c, bool make) {
    if (make) weight(c, VOCAB, HID);
    return ag_embedding(c->ctx, "embed", c->ids, 1, c->T, c->in[0]);
}

static ag_tensor *op_rmsnorm(bench_case *c, bool make) {
    if (make) {
        activation(c, HID);
        weight(c, HID, 0);
    }
    return ag_rmsnorm(c->ctx, "norm", c->in[0], c->in[1], 1e-5f);
}

static ag_tensor *op_rope(bench_case *c, bool make) {
    if (make) activation(c, HQ * HD);
    return ag_rope(c->ctx, "rope", c->in[0], HQ, HD, 100000.0f, 0);
}

static ag_tensor *op_attention(bench_case *c, bool make) {
    if (make) {
        activation(c, HQ * HD);
        activation(c, HKV * HD);
        activation(c, HKV * HD);
    }
    return ag_attention(c->ctx, "attn", c->in[0], c->in[1], c->in[2], HQ, HKV, HD);
}

static ag_tensor *op_silu(bench_case *c, bool make) {
    if (make) activation(c, INTER);
    return ag_silu(c->ctx, "silu", c->in[0]);
}

static ag_tensor *op_mul(bench_case *c, bool make) {
    if (make) {
        activation(c, INTER);
        activation(c, INTER);
    }
    return ag_mul(c->ctx, "mul", c->in[0], c->in[1]);
}

static ag_tensor *op_add(bench_case *c, bool make) {
    if (make) {
        activation(c, HID);
        activation(c, HID);
    }
    return ag_add(c->ctx, "add", c->in[0], c->in[1]);
}

static ag_tensor *op_cross_entropy(bench_case *c, bool make) {
    if (make) activation(c, VOCAB);
    return ag_cross_entropy(c->ctx, "loss", c->in[0], c->ids);
}

typedef struct {
    const char *name;
    ag_tensor *(*run)(bench_case *c, bool make);
} bench_op;

static const bench_op ops[] = {
    {"embedding", op_embedding},
    {"rmsnorm", op_rmsnorm},
    {"linear q_proj 576>576", op_q_proj},
    {"linear k_proj 576>192", op_k_proj},
    {"linear gate 576>1536", op_gate},
    {"linear down 1536>576", op_down},
    {"linear lm_head 576>49152", op_lm_head},
    {"rope q 9x64", op_rope},
    {"attention 9/3x64", op_attention},
    {"silu 1536", op_silu},
    {"mul 1536", op_mul},
    {"add 576", op_add},
    {"cross_entropy 49152", op_cross_entropy},
};

typedef struct {
    double fwd, bwd;             // median seconds
    double fwd_share, bwd_share; // of the time summed over all runs, the part in sgemm
} bench_result;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Forward then backward (seeded with ones), gradients dropped between repetitions as a
// training step's zero_grad would; one repetition first to warm up.
static bench_result run_op(ag_ctx *ctx, const bench_op *op, int64_t T, int32_t *ids, int reps) {
    bench_case c = {.ctx = ctx, .T = T, .ids = ids};
    double fwd[64], bwd[64], sum_fwd = 0.0, sum_bwd = 0.0, sg_fwd = 0.0, sg_bwd = 0.0;
    for (int r = -1; r < reps; r++) {
        ag_blas_stats s0 = ag_get_blas_stats();
        double t0 = bench_now();
        ag_tensor *y = bench_checked("bench_ops", c.ctx, op->run(&c, r == -1 && c.nin == 0));
        double t1 = bench_now();
        ag_blas_stats s1 = ag_get_blas_stats();
        ag_tensor *seed =
            bench_checked("bench_ops", c.ctx, ag_tensor_new(ctx, y->ndim, y->shape, MP_ACTIVATION, "seed"));
        for (int64_t i = 0; i < seed->numel; i++) ag_f32(seed)[i] = 1.0f;
        double t2 = bench_now();
        if (ag_backward_grad(ctx, y, seed) != AG_OK) bench_checked("bench_ops", c.ctx, NULL);
        double t3 = bench_now();
        ag_blas_stats s2 = ag_get_blas_stats();
        ag_release(seed);
        ag_release(y);
        for (int i = 0; i < c.nin; i++) ag_zero_grad(c.in[i]);
        if (r < 0) continue;
        fwd[r] = t1 - t0, bwd[r] = t3 - t2;
        sum_fwd += fwd[r], sum_bwd += bwd[r];
        sg_fwd += s1.seconds - s0.seconds, sg_bwd += s2.seconds - s1.seconds;
    }
    for (int i = 0; i < c.nin; i++) ag_release(c.in[i]);
    return (bench_result){median(fwd, reps), median(bwd, reps), sg_fwd / sum_fwd, sg_bwd / sum_bwd};
}

static void run_tokens(ag_ctx *ctx, int64_t T, int reps) {
    int32_t *ids = malloc((size_t)T * sizeof *ids);
    for (int64_t i = 0; i < T; i++) ids[i] = (int32_t)(bench_uniform() * VOCAB);
    printf("\n%lld tokens (batch 1), median of %d runs\n", (long long)T, reps);
    printf("%-26s %10s %10s %8s %8s\n", "op", "fwd ms", "bwd ms", "sgemm%f", "sgemm%b");
    double total = 0.0, total_sgemm = 0.0;
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) {
        bench_result r = run_op(ctx, &ops[i], T, ids, reps);
        printf("%-26s %10.3f %10.3f %7.0f%% %7.0f%%\n", ops[i].name, 1e3 * r.fwd, 1e3 * r.bwd, 100.0 * r.fwd_share,
               100.0 * r.bwd_share);
        total += r.fwd + r.bwd;
        total_sgemm += r.fwd * r.fwd_share + r.bwd * r.bwd_share;
    }
    printf("%-26s %21.3f %16.0f%%\n", "all ops, fwd + bwd", 1e3 * total, 100.0 * total_sgemm / total);
    free(ids);
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 5;
    if (reps < 1 || reps > 64) {
        fprintf(stderr, "usage: bench_ops [reps 1..64] [tokens...]\n");
        return 2;
    }
    if (mp_init(&(mp_options){0}) != MP_OK) {
        fprintf(stderr, "bench_ops: the profiler did not start\n");
        return 1;
    }
    ag_ctx *ctx = ag_ctx_new();
    printf("bench_ops: SmolLM2-135M shapes, float32\n");
    if (argc > 2)
        for (int i = 2; i < argc; i++) run_tokens(ctx, atoll(argv[i]), reps);
    else {
        run_tokens(ctx, 25, reps);
        run_tokens(ctx, 512, reps);
    }
    ag_ctx_free(ctx);
    mp_shutdown();
    return 0;
}
