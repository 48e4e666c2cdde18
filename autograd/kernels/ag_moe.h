// What the mixture-of-experts ops share (moe.c): billed scratch, PyTorch's int64 index tensors,
// the balanced routing, and a routing's pairs grouped by expert.
#pragma once

#include "ag_internal.h"
#include "ag_kernels.h"

// An activation block of `bytes`, labelled "<base>:<what>" and billed exactly; false with the
// context's error set.
bool ag_moe_temp(ag_ctx *ctx, mp_block *b, const char *base, const char *what, int64_t bytes);
// A tensor of n int64 elements (PyTorch's index tensors), 8 bytes each whatever the dtype,
// labelled "<base>:<what>"; its data (a real run) holds int64 values.
ag_tensor *ag_moe_int64(ag_ctx *ctx, const char *base, const char *what, int64_t n);
// The balanced routing: the N k pairs spread over the E experts as evenly as they go (the first
// N k mod E experts one more).
void ag_moe_balanced(int64_t N, int E, int k, int64_t *count);

// The indices of the k largest of p[E], largest first (the first of equal ones first).
void ag_moe_topk(const float *p, int E, int k, int32_t *sel);
// p[E] = softmax(z) in float32, as the attention's softmax computes it; returns max(z).
float ag_moe_softmax_row(const float *z, int E, float *p);

// A routing's pairs grouped by expert: expert e's are pair[off[e] .. off[e + 1]), each t k + j
// (token t's j-th choice), in torch.where's order over the expert's [k, N] mask: choice j first,
// then token. pair is NULL in meta mode (the counts alone).
typedef struct {
    int64_t *off;  // [E + 1]
    int64_t *pair; // [N k]
} ag_moe_groups;
bool ag_moe_group(const ag_moe_routing *r, ag_moe_groups *g); // false: out of memory
void ag_moe_groups_free(ag_moe_groups *g);

// A billed block of the activations' dtype, as an ag_buf ("<base>:<what>", numel elements);
// false with the context's error set.
typedef struct {
    mp_block b;
    ag_buf v;
} ag_moe_scratch;
bool ag_moe_scratch_new(ag_ctx *ctx, ag_moe_scratch *s, const char *base, const char *what, int64_t numel);
// dst[i] = src[row(pair[i])] for rows of H: token rows (t = pair / k) of x, or of dy.
void ag_moe_gather(ag_buf dst, ag_buf src, const int64_t *pair, int64_t n, int k, int64_t H);
// y[t] = Σ w[pair] Y[i] over each token's pairs, summed in choice order (as index_add_ adds
// the experts' outputs one expert after another: each row gets its k terms, one per expert).
void ag_moe_combine(ag_buf y, ag_buf Y, ag_buf w, const ag_moe_groups *g, int E, int64_t N, int k, int64_t H);
// dx[t] (+)= dxp[i] for each pair i of token t (fresh: dx zeroed first): the gathered rows'
// gradient back into x's rows.
void ag_moe_scatter_add(ag_buf dx, bool fresh, ag_buf dxp, const ag_moe_groups *g, int64_t N, int k, int64_t H);
