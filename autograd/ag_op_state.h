// The state each op keeps on its tape node for backward: one struct per op with named fields,
// held in the node as the union ag_op_state, tagged by the node's op.
//
// An op's saved tensors (retained, released right after its node's backward ran) come first in
// its struct, named and overlaid with an array `saved`: node.c releases and lists them through
// the union's generic view without knowing the op. Host memory an op copies (ids, positions,
// labels) is a named field too, freed by the op's release function.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "autograd.h"
#include "kernels/ag_att.h"

// The n saved tensors of a state lie in a row from its start, as its array `saved` and the
// generic view read them.
#define AG_SAVED_IN_A_ROW(type, last, n)                                                                               \
    _Static_assert(offsetof(type, last) == ((n)-1) * sizeof(ag_tensor *) &&                                            \
                       sizeof(((type *)0)->saved) == (n) * sizeof(ag_tensor *) && (n) <= AG_MAX_SAVED,                 \
                   #type ": saved tensors in a row, at most AG_MAX_SAVED")

// linear: y[rows, out] = x[rows, in] · w[out, in]ᵀ (+ b[out]).
typedef struct {
    union {
        struct {
            ag_tensor *x;  // for dw; NULL when w wants no gradient
            ag_tensor *w;  // for dx; NULL when x wants no gradient
            ag_tensor *bc; // autocast: the bias's 16-bit cast (kept as the weight's is); else NULL
        };
        ag_tensor *saved[3];
    };
    int64_t rows, in, out;
    bool bias; // a third input, b[out]: db = the column sums of dy
    bool cast; // autocast cast an operand (x, w or b): backward goes through the casts' ToCopyBackward
} ag_linear_state;
AG_SAVED_IN_A_ROW(ag_linear_state, bc, 3);

// embedding: y[rows, hidden] = table[ids[r]] from a table [vocab, hidden]; no tensor is saved.
typedef struct {
    int64_t rows, hidden, vocab;
    int64_t padding_idx; // the id whose row gets no gradient (nn.Embedding's padding_idx); -1: none
    int32_t *ids;        // malloc'd copy of the rows' ids; NULL in meta mode
} ag_embedding_state;

// rmsnorm over rows of `hidden` elements.
typedef struct {
    union {
        struct {
            ag_tensor *x;
            ag_tensor *rstd; // [rows], float32 whatever the dtype
            ag_tensor *w;    // for dx; NULL when x wants no gradient
            ag_tensor *h;    // PYTORCH: x * rstd, kept by the weight's mul
            ag_tensor *sq;   // PYTORCH_113: x², kept by MeanBackward1
        };
        ag_tensor *saved[5];
    };
    int64_t rows, hidden;
    float offset; // the weight applied as offset + w (Gemma's 1 + w), 0 otherwise
} ag_rmsnorm_state;
AG_SAVED_IN_A_ROW(ag_rmsnorm_state, sq, 5);

// rope over x[B, T, heads * head_dim]; saves nothing, backward recomputes the angles.
typedef struct {
    int64_t B, T;
    int64_t pos0; // the position of t = 0 when pos is NULL
    int heads, head_dim;
    ag_rope_freqs freqs; // its inv_freq (when not NULL) is the caller's, alive until backward
    int32_t *pos;        // malloc'd copy of one position per row [B*T], or NULL
} ag_rope_state;

// rope_cs over x[B, T, heads * head_dim] with HF's tables, kept for backward.
typedef struct {
    union {
        struct {
            ag_tensor *cos, *sin; // [1, T, head_dim]
        };
        ag_tensor *saved[2];
    };
    int64_t B, T;
    int heads, head_dim;
} ag_rope_cs_state;
AG_SAVED_IN_A_ROW(ag_rope_cs_state, sin, 2);

// attention (eager): the probabilities and what each gradient reads.
typedef struct {
    union {
        struct {
            ag_tensor *q;     // for dk; NULL when k wants no gradient
            union {
                ag_tensor *k;    // for dq; NULL when q wants no gradient
                ag_tensor *tanh; // PYTORCH (k_rep kept instead of k), a soft-cap: tanh's output, TanhBackward's
            };
            ag_tensor *v;     // for dP; NULL when neither q nor k wants a gradient
            ag_tensor *probs; // [B, Hq, Tq, Tk]
            // PYTORCH (HF eager attention): q is the rope output (B = 1) or the contiguous copy the
            // score matmul makes of it (B > 1); k and v are NULL, the matmuls' operands kept instead:
            // [B, Hq, Tk, D] copies (repeat_kv's, the matmuls' own, autocast's casts), or k and v
            // themselves [B, Tk, Hkv*D] where no copy is made.
            ag_tensor *k_rep, *v_rep;
            ag_tensor *scale; // the float64 scalar that `* scaling` wraps: 8 bytes
            // 16 bits (meta mode): the probabilities as `probs @ v` takes them, a 16-bit copy of
            // the float32 softmax (`.to(query.dtype)` in a 16-bit model, autocast's cast); NULL
            // when that is probs itself. k_rep, v_rep and q are then the matmuls' operands.
            ag_tensor *probs_cast;
        };
        ag_tensor *saved[8];
    };
    ag_att_dims dims;
} ag_attention_state;
AG_SAVED_IN_A_ROW(ag_attention_state, probs_cast, 8);

// attention_sinks (gpt_oss, eager, LEAN): what attention keeps; the sinks' gradient reads the
// probabilities (p_sink = 1 - Σ P) and dP = dO Vᵀ.
typedef struct {
    union {
        struct {
            ag_tensor *q, *k, *v;
            ag_tensor *probs; // [B, Hq, Tq, Tk]
        };
        ag_tensor *saved[4];
    };
    ag_att_dims dims;
} ag_attention_sinks_state;
AG_SAVED_IN_A_ROW(ag_attention_sinks_state, probs, 4);

// attention_mla: attention's saved set with values of a head size of their own (dims.D is q's and
// k's; dims.Hq = Hkv).
typedef struct {
    union {
        struct {
            ag_tensor *q, *k, *v;
            ag_tensor *probs; // [B, H, Tq, Tk]
        };
        ag_tensor *saved[4];
    };
    ag_att_dims dims;
    int Dv;
} ag_attention_mla_state;
AG_SAVED_IN_A_ROW(ag_attention_mla_state, probs, 4);

// head_slice and head_cat (DeepSeek's split and cat of heads' columns): sizes only.
typedef struct {
    int64_t rows, nh, stride, off, width;
    bool deinterleave;
} ag_head_slice_state;
typedef struct {
    int64_t rows, nh, da, db, b_heads;
} ag_head_cat_state;

// attention (flash, ops/attention_flash.c): what the SDPA kernel keeps for backward (its row).
typedef struct {
    union {
        struct {
            ag_tensor *q, *k, *v; // k and v at the key-value heads (autocast: their 16-bit casts)
            ag_tensor *out;       // the kernel's output: [B, Tq, Hq*D], or [B, Hq, Tq, D] heads first
            ag_tensor *lse;       // [B, Hq, lse_ld], float32 whatever the dtype (with sinks: the sink in it)
            ag_tensor *seed;      // the RNG seed and offset the kernel keeps on the device; else NULL
            ag_tensor *offset;
            ag_tensor *sinks; // gpt_oss's [Hq], NULL: none
        };
        ag_tensor *saved[8];
    };
    ag_att_dims dims;
    int64_t lse_ld;               // Tq, rounded up as the kernel pads the log-sum-exp
    const ag_sdpa_kernel *kernel; // its row
    bool heads_first;             // out laid out [B, Hq, Tq, D]
} ag_attention_flash_state;
AG_SAVED_IN_A_ROW(ag_attention_flash_state, sinks, 8);

// linear_parts: y = x · wᵀ laid out part after part (a fused projection).
#define AG_LINEAR_MAX_PARTS 4
typedef struct {
    union {
        struct {
            ag_tensor *x; // for dw; NULL when w wants no gradient
            ag_tensor *w; // for dx; NULL when x wants no gradient
        };
        ag_tensor *saved[2];
    };
    int64_t rows, in;
    int nparts;
    int64_t part[AG_LINEAR_MAX_PARTS]; // w's rows of each part
} ag_linear_parts_state;
AG_SAVED_IN_A_ROW(ag_linear_parts_state, w, 2);

// part: elements [offset, offset + numel) of its input; nothing saved.
typedef struct {
    int64_t offset;
    int kind; // ag_part_kind
} ag_part_state;

// silu: y = x * sigmoid(x).
typedef struct {
    union {
        struct {
            ag_tensor *x;
        };
        ag_tensor *saved[1];
    };
} ag_silu_state;
AG_SAVED_IN_A_ROW(ag_silu_state, x, 1);

// softcap: y = c tanh(x / c); backward reads y (LEAN) or tanh's output (PYTORCH).
typedef struct {
    union {
        struct {
            ag_tensor *y, *tanh; // one of them, the other NULL
        };
        ag_tensor *saved[2];
    };
    float c;
} ag_softcap_state;
AG_SAVED_IN_A_ROW(ag_softcap_state, tanh, 2);

// mul: y = a * b.
typedef struct {
    union {
        struct {
            ag_tensor *a; // for db; NULL when b wants no gradient
            ag_tensor *b; // for da; NULL when a wants no gradient
        };
        ag_tensor *saved[2];
    };
} ag_mul_state;
AG_SAVED_IN_A_ROW(ag_mul_state, b, 2);

// cross_entropy of logits[B, T, V].
typedef struct {
    union {
        struct {
            ag_tensor *logits;
            ag_tensor *lse; // [B*(T-1)], float32 whatever the dtype
            // PYTORCH (transformers' ForCausalLMLoss): logits and lse NULL; log_softmax of every
            // row [B*T, V], the int64 labels nll_loss keeps (padded [B, T+1] for B = 1, the
            // shifted copy [B, T] otherwise) and nll_loss's 4-byte total_weight.
            ag_tensor *logp, *labels_t, *total_weight;
        };
        ag_tensor *saved[5];
    };
    int64_t B, T, V;
    int logits_bits; // PYTORCH: the logits' element size (16: a float32 copy feeds log_softmax)
    int32_t *labels; // malloc'd copy of the ids [B*T]; NULL in meta mode
} ag_cross_entropy_state;
AG_SAVED_IN_A_ROW(ag_cross_entropy_state, total_weight, 5);

// checkpoint: y = fn(x), recomputed in backward.
typedef struct {
    union {
        struct {
            ag_tensor *x;
            ag_tensor *args[2], *tuple[2]; // what the caller handed over and the framework keeps
            ag_tensor *rng;                // preserve_rng_state's CPU state (PYTORCH)
        };
        ag_tensor *saved[6];
    };
    ag_block_fn fn;
    void *arg;          // malloc'd copy of the block's argument; NULL when it has no bytes
    unsigned char held; // bits of `saved` the node holds until the graph goes, not just to backward
} ag_checkpoint_state;
AG_SAVED_IN_A_ROW(ag_checkpoint_state, rng, 6);

// scale: y = s x; nothing saved.
typedef struct {
    float s;
} ag_scale_state;

// repeat_kv: x[rows, hkv * D] to [rows, hkv * rep * D]; nothing saved.
typedef struct {
    int64_t rows;
    int hkv, rep, D;
} ag_repeat_kv_state;

// dropout: the one-byte mask (PYTORCH; NULL under LEAN, where backward draws it again).
typedef struct {
    union {
        struct {
            ag_tensor *mask;
        };
        ag_tensor *saved[1];
    };
    float p;
    uint64_t seed;
} ag_dropout_state;
AG_SAVED_IN_A_ROW(ag_dropout_state, mask, 1);

// moe_route: the router's logits to the top-k weights of each token (softmax in float32, top-k,
// renormalised when asked).
typedef struct {
    union {
        struct {
            ag_tensor *probs; // [N, E] float32: the softmax
            // PYTORCH: topk's int64 indices [N, k] (TopkBackward's), and with renorm the sum [N, 1]
            // and the values before `/=` [N, k] (DivBackward's other and self); else NULL
            ag_tensor *indices, *sum, *clone;
        };
        ag_tensor *saved[4];
    };
    int64_t N;
    int E, k;
    bool renorm;
    bool topk_first; // gpt_oss: probs is [N, k], the softmax of the k largest logits
    int32_t *sel;    // malloc'd: the chosen experts [N * k]; NULL in meta mode
    bool group;    // deepseek_v3: probs the sigmoid scores [N, E], the weights times scaling
    float scaling;
} ag_moe_route_state;
AG_SAVED_IN_A_ROW(ag_moe_route_state, clone, 4);

// moe_experts (LEAN): every routed pair's gate and up outputs, grouped by expert.
typedef struct {
    union {
        struct {
            ag_tensor *x;     // [N, H]
            ag_tensor *w;     // [N, k] the routing weights
            ag_tensor *g, *u; // [N * k, I]: gate_e(x) and up_e(x) of each pair, expert by expert
        };
        ag_tensor *saved[4];
    };
    int64_t N, H, inter; // tokens, hidden, each expert's intermediate
    int E, k;
    ag_tensor **weights; // malloc'd, retained: gate[E], up[E], down[E]
    int32_t *sel;        // malloc'd: the chosen experts [N * k]; NULL in meta mode
    int64_t *count;      // malloc'd: the pairs each expert got [E]
} ag_moe_experts_state;
AG_SAVED_IN_A_ROW(ag_moe_experts_state, u, 4);

// moe_experts_stacked (gpt_oss, LEAN): every routed pair's gate_up output, grouped by expert.
typedef struct {
    union {
        struct {
            ag_tensor *x;                       // [N, H]
            ag_tensor *w;                       // [N, k] the routing weights
            ag_tensor *gu;                      // [N * k, 2 I]: each pair's gate_up output, expert by expert
            ag_tensor *gu_w, *gu_b, *d_w, *d_b; // the stacked weights and biases (biases may be NULL)
        };
        ag_tensor *saved[7];
    };
    int64_t N, H, inter;
    int E, k;
    ag_moe_glu glu;
    int32_t *sel;   // malloc'd: the chosen experts [N * k]; NULL in meta mode
    int64_t *count; // malloc'd: the pairs each expert got [E]
} ag_moe_stacked_state;
AG_SAVED_IN_A_ROW(ag_moe_stacked_state, d_b, 7);

// index_rows: y[n, C] = rows of src viewed as [R, C].
typedef struct {
    union {
        struct {
            ag_tensor *index; // PYTORCH: the int64 index tensor IndexBackward keeps (may be NULL)
        };
        ag_tensor *saved[1];
    };
    int64_t R, C, n;
    int64_t *rows; // malloc'd [n]; NULL in meta mode
} ag_index_rows_state;
AG_SAVED_IN_A_ROW(ag_index_rows_state, index, 1);

// scale_rows: y[n, C] = x[n, C] * s[n, 1].
typedef struct {
    union {
        struct {
            ag_tensor *x, *s; // x for ds, s for dx (PYTORCH's MulBackward keeps both)
        };
        ag_tensor *saved[2];
    };
    int64_t n, C;
} ag_scale_rows_state;
AG_SAVED_IN_A_ROW(ag_scale_rows_state, s, 2);

// index_add: acc[rows[i]] += src[i], in place (PyTorch's index_add_).
typedef struct {
    union {
        struct {
            ag_tensor *src;   // PYTORCH: IndexAddBackward keeps the source
            ag_tensor *index; // and its index
        };
        ag_tensor *saved[2];
    };
    int64_t R, C, n;
    int64_t *rows; // malloc'd [n]; NULL in meta mode
} ag_index_add_state;
AG_SAVED_IN_A_ROW(ag_index_add_state, index, 2);

// sigmoid_gate: y[N, C] = sigmoid(g[N, 1]) * x[N, C] (qwen2_moe's shared expert gate).
typedef struct {
    union {
        struct {
            ag_tensor *sig; // [N, 1], sigmoid(g): SigmoidBackward's result and the mul's
            ag_tensor *x;
        };
        ag_tensor *saved[2];
    };
    int64_t N, C;
} ag_sigmoid_gate_state;
AG_SAVED_IN_A_ROW(ag_sigmoid_gate_state, x, 2);

// moe_aux_loss: the load-balancing loss of the routers' logits (each layer's [N, E]).
typedef struct {
    union {
        struct {
            ag_tensor *probs; // [L * N, E] float32: the softmax of the concatenated logits
        };
        ag_tensor *saved[1];
    };
    int64_t rows;
    int E, k, layers;
    float *frac; // malloc'd: the fraction of pairs routed to each expert [E]; NULL in meta mode
    float scale; // d loss / d mean prob factor: E / rows
} ag_moe_aux_loss_state;
AG_SAVED_IN_A_ROW(ag_moe_aux_loss_state, probs, 1);

// One node's state: the member named after the node's op (add keeps none).
typedef union {
    ag_tensor *saved[AG_MAX_SAVED]; // the generic view of any op's saved tensors
    ag_linear_state linear;
    ag_embedding_state embedding;
    ag_rmsnorm_state rmsnorm;
    ag_rope_state rope;
    ag_rope_cs_state rope_cs;
    ag_attention_state attention;
    ag_attention_flash_state attention_flash;
    ag_attention_sinks_state attention_sinks;
    ag_attention_mla_state attention_mla;
    ag_head_slice_state head_slice;
    ag_head_cat_state head_cat;
    ag_silu_state silu;
    ag_linear_parts_state linear_parts;
    ag_part_state part;
    ag_softcap_state softcap;
    ag_mul_state mul;
    ag_cross_entropy_state cross_entropy;
    ag_checkpoint_state checkpoint;
    ag_scale_state scale;
    ag_repeat_kv_state repeat_kv;
    ag_dropout_state dropout;
    ag_moe_route_state moe_route;
    ag_moe_experts_state moe_experts;
    ag_moe_stacked_state moe_stacked;
    ag_index_rows_state index_rows;
    ag_scale_rows_state scale_rows;
    ag_index_add_state index_add;
    ag_sigmoid_gate_state sigmoid_gate;
    ag_moe_aux_loss_state moe_aux_loss;
} ag_op_state;

// The number of saved tensors of the state member `m`.
#define AG_NSAVED(m) ((int)(sizeof(((ag_op_state *)0)->m.saved) / sizeof(ag_tensor *)))
