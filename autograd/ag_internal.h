// autograd internals shared by the context, the tape, the backward pass and the ops.
#pragma once

#include "ag_op_state.h"
#include "autograd.h"

#define AG_MAX_INPUTS 3 // edges a node holds inline; an op with more (the experts of a mixture) gets them on the heap
#define AG_LABEL_MAX 256

// Writes the gradients of the node's inputs from dout, the gradient of its output (its dtype is
// the node's grad_dtype).
typedef void (*ag_backward_fn)(ag_ctx *ctx, ag_node *n, const void *dout);

// What the nodes of one op share (one static instance per op, in its file): it tags the node's
// state, so the generic code knows how many saved tensors to release and what else to free.
typedef struct {
    const char *name; // "linear", ...
    ag_backward_fn backward;
    int nsaved;                       // saved tensors leading its state (AG_NSAVED), NULL ones included
    void (*release)(ag_op_state *st); // frees the host memory the state owns; NULL: none
} ag_op;

typedef enum { AG_EDGE_NONE, AG_EDGE_NODE, AG_EDGE_LEAF } ag_edge_kind;

// Where the gradient of one input goes.
typedef struct {
    ag_edge_kind kind;
    ag_node *node;   // AG_EDGE_NODE: the input's creator, which owns the gradient buffer
    ag_tensor *leaf; // AG_EDGE_LEAF: retained; the gradient accumulates into leaf->grad
} ag_edge;

struct ag_node {
    const ag_op *op; // tags `state`
    uint32_t site;   // the site prefix
    size_t index;    // on the tape
    int ninputs;
    ag_edge *in; // [ninputs]: in_inline, or malloc'd past AG_MAX_INPUTS
    ag_edge in_inline[AG_MAX_INPUTS];
    ag_tensor *out; // weak: cleared when the output tensor is freed
    int64_t numel;  // of the output
    int ndim;       // and its shape, for the description of its gradient's block
    int64_t shape[AG_MAX_DIMS];
    ag_dtype grad_dtype; // of the output's gradient: the output's own under PYTORCH semantics
    mp_block grad;       // gradient of the output; bytes == 0 until a consumer wrote it
    ag_op_state state;   // the member op names; its saved tensors are retained until backward ran
};

struct ag_ctx {
    bool grad_enabled;
    ag_precision dtype;         // element sizes billed (meta mode); float32 by default
    const ag_framework_row *fw; // the framework's row: every framework decision the ops make
    ag_tensor **held;           // what backward's nodes left for the graph's life (ag_tape_clear)
    size_t nheld, heldcap;
    ag_attention_kind attention;
    const ag_device_row *dev; // the device's row: which kernel each attention is
    ag_node **tape;
    size_t ntape, cap;
    ag_status status;
    char msg[256];
    ag_leaf_hooks hooks; // hooks.c: none unless set
    bool defer_params;   // ag_param_new makes parameters without storage
    // torch.autocast's cast cache: the 16-bit copies of float32 leaves that want a gradient, one a
    // leaf, kept until the autocast region exits (ag_autocast_cache_clear).
    struct ag_cast_entry {
        ag_tensor *leaf, *cast;
    } * casts;
    size_t ncasts, capcasts;
};

// The cast a linear's weight gets under autocast: the cached one, or w cast now (and cached when
// w is a float32 leaf wanting a gradient, as autocast_mode.cpp's cached_cast does). NULL: no room.
ag_tensor *ag_autocast_weight(ag_ctx *ctx, ag_tensor *w, const char *label);
// The autocast region exits (its outermost __exit__ clears the cache): the training forward
// before backward, a checkpoint's recomputation before the block's backward, the context freed.
void ag_autocast_cache_clear(ag_ctx *ctx);

// A gradient destination handed to backward code.
typedef struct {
    void *data;     // NULL in meta mode
    ag_dtype dtype; // of data
    bool needed;    // false: the input needs no gradient, skip its computation
    bool fresh;     // just allocated, contents undefined: write with '=' / beta 0, not accumulate
} ag_grad_dst;
static inline ag_buf ag_dst_buf(const ag_grad_dst *d) { return (ag_buf){d->data, d->dtype}; }

// Labels derived from an op's site argument (see autograd.h).
// The prefix is kept shorter than a label, so that every "<prefix>:<suffix>" fits one.
typedef struct {
    char base[AG_LABEL_MAX - 32];
    char out[AG_LABEL_MAX];
} ag_site;

// hooks.c: the context's leaf hooks around node n's backward (none set: nothing). Before it
// runs, for each leaf it reaches; after it was freed, for each leaf whose gradient is final.
bool ag_hooks_before(ag_ctx *ctx, const ag_node *n);
void ag_hooks_after(ag_ctx *ctx, ag_tensor *const *leaves, int n);

// error.c: keeps the first error (later ones are usually its consequences); returns false.
bool ag_fail(ag_ctx *ctx, ag_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
// False (quietly) after an earlier error, or with the error set when an input is NULL.
bool ag_check_inputs(ag_ctx *ctx, const char *op, const char *site, int n, ag_tensor *const *ins,
                     const char *const *names);

// tensor.c
ag_tensor *ag_tensor_like(ag_ctx *ctx, const ag_tensor *t, mp_category cat, const char *label);
// A tensor's header of that shape (numel, one reference) with no storage, for the constructors of
// a tensor, a deferred parameter and a view to fill in; NULL (the context failed, naming what
// and label) when out of memory. The shape is the caller's to check.
ag_tensor *ag_tensor_header(ag_ctx *ctx, int ndim, const int64_t *shape, const char *what, const char *label);
// bytes: the float32 size of the data; billed at the context's dtype for the category (the
// same size in real runs, which are float32 only).
// A block of `bytes` float32 bytes, billed at the category's dtype in meta mode.
bool ag_alloc_block(ag_ctx *ctx, mp_block *b, size_t bytes, mp_category cat, const char *label);
static inline int ag_max_bits(int a, int b) { return a > b ? a : b; } // PyTorch's type promotion
// The output of an elementwise op of a and b (a's shape): under PYTORCH semantics at the wider
// of their element sizes, else as ag_tensor_like(a).
ag_tensor *ag_tensor_promoted(ag_ctx *ctx, const ag_tensor *a, const ag_tensor *b, const char *label);
// A block of exactly `bytes`, whatever the dtype (a float64 scalar, int64 labels).
bool ag_alloc_exact(ag_ctx *ctx, mp_block *b, size_t bytes, mp_category cat, const char *label);
// An activation block of that shape at bits an element, described as such (the trace's shape).
bool ag_alloc_shaped(ag_ctx *ctx, mp_block *b, int ndim, const int64_t *shape, int bits, const char *label);
// A tensor billed at float32 whatever the dtype: the statistics PyTorch's autocast keeps in
// float32 (RMSNorm's rstd, the cross-entropy's log-sum-exp).
ag_tensor *ag_tensor_new_f32(ag_ctx *ctx, int ndim, const int64_t *shape, mp_category cat, const char *site);
// "[2, 5, 8]" into buf, for error messages.
const char *ag_shape_str(const ag_tensor *t, char buf[64]);
bool ag_same_shape(ag_ctx *ctx, const char *op, const char *site, const ag_tensor *a, const ag_tensor *b);

// site.c
void ag_site_parse(ag_site *s, const char *site);
// "<base>:<suffix>" into buf[AG_LABEL_MAX], cut if longer; returns snprintf's length.
int ag_label(char *buf, const char *base, const char *suffix);

// node.c
bool ag_needs_grad(const ag_ctx *ctx, const ag_tensor *t);
bool ag_any_needs_grad(const ag_ctx *ctx, int n, ag_tensor *const *ins);
// Appends a node making `out` from the inputs, its state zeroed for the op to fill (saved
// tensors retained); NULL with the error set if out of memory.
ag_node *ag_record(ag_ctx *ctx, const ag_op *op, const char *base, ag_tensor *out, int n, ag_tensor *const *ins);
// Whether input i is the node's first edge to its leaf (a leaf counts each node once).
bool ag_first_edge_to(const ag_node *n, int i);
static inline bool ag_wants_grad(const ag_node *n, int i) { return n->in[i].kind != AG_EDGE_NONE; }
void ag_node_free(ag_node *n);
// The context's tape: a node appended (false with the error set when out of memory).
bool ag_tape_push(ag_ctx *ctx, ag_node *n);
// Frees the nodes above `floor` without running them.
void ag_tape_clear_to(ag_ctx *ctx, size_t floor);
// Keeps t (retained) until the graph goes: ag_tape_clear. False with the error set if out of memory.
bool ag_graph_hold(ag_ctx *ctx, ag_tensor *t);

// torch.autocast's semantics: an autocast dtype under a framework that has them.
static inline bool ag_autocast(const ag_ctx *ctx) { return ctx->dtype.autocast && AG_FW(ctx->fw, autocast); }

// grad.c
bool ag_grad_get(ag_ctx *ctx, ag_node *n, int i, ag_grad_dst *dst);
// All inputs at once; inputs sharing one target are resolved so every write accumulates.
bool ag_grad_get_all(ag_ctx *ctx, ag_node *n, ag_grad_dst *dst);
// Hands the node's own gradient buffer over to input i when that input is a node with no
// gradient yet and the same size (identity backward, as add): no copy, no new buffer.
bool ag_grad_pass(ag_node *n, int i);
// A gradient of input i (a node's output) that the op computed in a block of its own (billed as
// the input's gradient, its shape and dtype), handed to the engine as PyTorch's does: it becomes
// the input's gradient when none has arrived yet; otherwise PyTorch 1.13 sums the two out of
// place into a new block, current PyTorch adds it in place; the part is freed either way. An
// input that is not a node's output drops it. false with the error set.
bool ag_grad_hand_over(ag_ctx *ctx, ag_node *n, int i, mp_block *part);
// Backward of the nodes above `floor` only, newest first, each freed after it ran (the tape
// below stays as it was): how a checkpoint runs its block's private part of the tape.
ag_status ag_run_tape_to(ag_ctx *ctx, size_t floor);

// tensor_dtype.c: the dtype of a float element size (16: float16 when fp16, else bfloat16; 8: int8; 4: int4).
ag_dtype ag_dtype_of_bits(int bits, bool fp16);
