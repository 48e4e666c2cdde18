// autograd internals shared by the context, the tape, the backward pass and the ops.
#pragma once

#include <cblas.h>

#include "autograd.h"

#define AG_MAX_INPUTS 3
#define AG_LABEL_MAX 256

// Writes the gradients of the node's inputs from dout, the gradient of its output.
typedef void (*ag_backward_fn)(ag_ctx *ctx, ag_node *n, const float *dout);

typedef enum { AG_EDGE_NONE, AG_EDGE_NODE, AG_EDGE_LEAF } ag_edge_kind;

// Where the gradient of one input goes.
typedef struct {
    ag_edge_kind kind;
    ag_node *node;   // AG_EDGE_NODE: the input's creator, which owns the gradient buffer
    ag_tensor *leaf; // AG_EDGE_LEAF: retained; the gradient accumulates into leaf->grad
} ag_edge;

struct ag_node {
    const char *op;
    uint32_t site; // the site prefix
    ag_backward_fn backward;
    size_t index; // on the tape
    int ninputs;
    ag_edge in[AG_MAX_INPUTS];
    int nsaved;
    ag_tensor *saved[AG_MAX_SAVED]; // retained until the node's backward ran
    ag_tensor *out;                 // weak: cleared when the output tensor is freed
    int64_t numel;                  // of the output
    mp_block grad;                  // gradient of the output; bytes == 0 until a consumer wrote it
    int64_t p[6];                   // op sizes
    float f[2];                     // op scalars
    int32_t *ints;                  // malloc'd copy of ids, labels or positions
};

struct ag_ctx {
    bool grad_enabled;
    ag_node **tape;
    size_t ntape, cap;
    ag_status status;
    char msg[256];
};

// A gradient destination handed to backward code.
typedef struct {
    float *data; // NULL in meta mode
    bool needed; // false: the input needs no gradient, skip its computation
    bool fresh;  // just allocated, contents undefined: write with '=' / beta 0, not accumulate
} ag_grad_dst;

// Labels derived from an op's site argument (see autograd.h).
// The prefix is kept shorter than a label, so that every "<prefix>:<suffix>" fits one.
typedef struct {
    char base[AG_LABEL_MAX - 32];
    char out[AG_LABEL_MAX];
} ag_site;

// ctx.c
bool ag_fail(ag_ctx *ctx, ag_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
bool ag_check_inputs(ag_ctx *ctx, const char *op, const char *site, int n,
                     ag_tensor *const *ins, const char *const *names);
bool ag_tape_push(ag_ctx *ctx, ag_node *n);
// "[2, 5, 8]" into buf, for error messages.
const char *ag_shape_str(const ag_tensor *t, char buf[64]);
bool ag_same_shape(ag_ctx *ctx, const char *op, const char *site, const ag_tensor *a,
                   const ag_tensor *b);

// tensor.c
ag_tensor *ag_tensor_like(ag_ctx *ctx, const ag_tensor *t, mp_category cat, const char *label);
bool ag_alloc_block(ag_ctx *ctx, mp_block *b, size_t bytes, mp_category cat, const char *label);

// site.c
void ag_site_parse(ag_site *s, const char *site);
// "<base>:<suffix>" into buf[AG_LABEL_MAX], cut if longer; returns snprintf's length.
int ag_label(char *buf, const char *base, const char *suffix);

// node.c
bool ag_needs_grad(const ag_ctx *ctx, const ag_tensor *t);
bool ag_any_needs_grad(const ag_ctx *ctx, int n, ag_tensor *const *ins);
// Appends a node making `out` from the inputs; NULL with the error set if out of memory.
ag_node *ag_record(ag_ctx *ctx, const char *op, const char *base, ag_tensor *out, int n,
                   ag_tensor *const *ins, ag_backward_fn fn);
// Keeps t (retained) in a fixed slot for backward; NULL leaves the slot empty.
void ag_save(ag_node *n, int slot, ag_tensor *t);
static inline bool ag_wants_grad(const ag_node *n, int i) { return n->in[i].kind != AG_EDGE_NONE; }
void ag_node_free(ag_node *n);

// grad.c
bool ag_grad_get(ag_ctx *ctx, ag_node *n, int i, ag_grad_dst *dst);
// All inputs at once; inputs sharing one target are resolved so every write accumulates.
bool ag_grad_get_all(ag_ctx *ctx, ag_node *n, ag_grad_dst *dst);
// Hands the node's own gradient buffer over to input i when that input is a node with no
// gradient yet and the same size (identity backward, as add): no copy, no new buffer.
bool ag_grad_pass(ag_node *n, int i);

// blas.c: cblas_sgemm, row-major, timed into ag_blas_stats.
void ag_sgemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K,
              float alpha, const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
              float *C, int64_t ldc);

// Loops are split over OpenMP threads only when long (tens of milliseconds serial). With the
// pthread build of OpenBLAS, its worker threads keep spinning for a while after each sgemm;
// an OpenMP region then waits for a scheduler slice on their core, which costs more than a
// short loop gains (silu over 512 x 1536: 2.7 ms serial, 7.7 ms split). Loops calling expf
// reach that length sooner than plain arithmetic.
#define AG_OMP_MIN (1 << 24)
#define AG_OMP_MIN_EXP (1 << 22)
