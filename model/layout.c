// The model described once: the table of a decoder block's parameters, with the rows that only
// some families, configs or layers have. Names, shapes, order, the tensor count, the parameter
// count and the model struct's slots all come from it (llama_param_info_of, llama_param_count,
// params.c).
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"

// A size of the config a shape is made of.
typedef enum {
    DIM_ONE,
    DIM_HIDDEN,
    DIM_Q,            // heads x head_dim
    DIM_KV,           // kv_heads x head_dim
    DIM_INTER,        // a dense MLP's intermediate
    DIM_INTER2,       // twice it (phi3's gate_up_proj)
    DIM_HEAD,         // head_dim
    DIM_HEADS,        // heads (gpt_oss's sinks)
    DIM_QKV,          // (heads + 2 x kv_heads) x head_dim (phi3's qkv_proj)
    DIM_EXPERTS,      // routed experts
    DIM_MOE_INTER,    // a routed expert's intermediate
    DIM_MOE_INTER2,   // twice it (gpt_oss's gate_up_proj)
    DIM_SHARED_INTER, // the shared expert's intermediate
    DIM_Q_LORA,       // q_lora_rank
    DIM_KV_LORA,      // kv_lora_rank
    DIM_KV_A,         // kv_lora_rank + qk_rope_head_dim
    DIM_Q_B,          // heads x (qk_nope + qk_rope)
    DIM_KV_B,         // heads x (qk_nope + v_head)
    DIM_O_MLA,        // heads x v_head
} dim;

// When a row is there.
typedef enum {
    ALWAYS,
    STD_ATTN,     // q, k, v and o_proj (every family but phi3 and deepseek_v3)
    QKV_BIAS,     // their biases
    O_BIAS,       // o_proj's bias
    QK_NORM,      // qwen3's, gemma3's q_norm and k_norm
    SINKS,        // gpt_oss
    FUSED_ATTN,   // phi3's qkv_proj and o_proj
    MLA_ANY,      // deepseek_v3's latent attention
    MLA_Q_LORA,   // ... with q_lora_rank
    MLA_Q_FULL,   // ... without
    DENSE,        // a dense layer's gate, up and down_proj
    DENSE_BIAS,   // their biases (mlp_bias)
    DENSE_FUSED,  // phi3's gate_up_proj and down_proj
    FF_NORMS,     // gemma's norms before and after the MLP
    MOE_MIXTRAL,  // a sparse layer of mixtral
    MOE_ROUTER,   // mlp.gate of qwen2_moe, qwen3_moe and deepseek_v3's sparse layers
    MOE_EXPERTS,  // their routed experts
    SCORE_BIAS,   // deepseek_v3's e_score_correction_bias
    SHARED_QWEN,  // qwen2_moe's shared expert
    SHARED_GATE,  // its gate
    SHARED_DS,    // deepseek_v3's shared experts
    MOE_STACKED,  // gpt_oss's router and stacked experts
    MOE_STACKED_B // their biases
} when;

typedef struct {
    const char *name;                // after "model.layers.{i}."; '*' stands for the expert's index
    dim shape[LLAMA_PARAM_MAX_DIMS]; // DIM_ONE past the tensor's dimensions
    int ndim;
    when cond;
    size_t slot;  // in llama_layer; of an ag_tensor ** array when expert
    bool expert;  // one per routed expert (consecutive rows of a group repeat expert by expert)
    bool stacked; // the routed experts stacked along dimension 0 (gpt_oss)
    bool buffer;
} layer_row;

#define S(f) offsetof(llama_layer, f)
#define R1(n, a, c, f)                                                                                                 \
    { n, {a, DIM_ONE, DIM_ONE}, 1, c, S(f), false, false, false }
#define R2(n, a, b, c, f)                                                                                              \
    { n, {a, b, DIM_ONE}, 2, c, S(f), false, false, false }
#define E2(n, a, b, c, f)                                                                                              \
    { n, {a, b, DIM_ONE}, 2, c, S(f), true, false, false }
#define K2(n, a, b, c, f)                                                                                              \
    { n, {a, b, DIM_ONE}, 2, c, S(f), false, true, false }
#define K3(n, a, b, d, c, f)                                                                                           \
    { n, {a, b, d}, 3, c, S(f), false, true, false }

// In Hugging Face's names and membill's order: each norm before what it feeds, each bias after
// its weight, Qwen3's q_norm and k_norm after o_proj (where Qwen3Attention registers them), a
// router before its experts, each expert's projections together.
static const layer_row rows[] = {
    R1("input_layernorm.weight", DIM_HIDDEN, ALWAYS, input_norm),
    R2("self_attn.q_proj.weight", DIM_Q, DIM_HIDDEN, STD_ATTN, q),
    R1("self_attn.q_proj.bias", DIM_Q, QKV_BIAS, q_bias),
    R2("self_attn.k_proj.weight", DIM_KV, DIM_HIDDEN, STD_ATTN, k),
    R1("self_attn.k_proj.bias", DIM_KV, QKV_BIAS, k_bias),
    R2("self_attn.v_proj.weight", DIM_KV, DIM_HIDDEN, STD_ATTN, v),
    R1("self_attn.v_proj.bias", DIM_KV, QKV_BIAS, v_bias),
    R2("self_attn.qkv_proj.weight", DIM_QKV, DIM_HIDDEN, FUSED_ATTN, qkv),
    R2("self_attn.q_a_proj.weight", DIM_Q_LORA, DIM_HIDDEN, MLA_Q_LORA, q_a),
    R1("self_attn.q_a_layernorm.weight", DIM_Q_LORA, MLA_Q_LORA, q_a_norm),
    R2("self_attn.q_b_proj.weight", DIM_Q_B, DIM_Q_LORA, MLA_Q_LORA, q_b),
    R2("self_attn.q_proj.weight", DIM_Q_B, DIM_HIDDEN, MLA_Q_FULL, q),
    R2("self_attn.kv_a_proj_with_mqa.weight", DIM_KV_A, DIM_HIDDEN, MLA_ANY, kv_a),
    R1("self_attn.kv_a_layernorm.weight", DIM_KV_LORA, MLA_ANY, kv_a_norm),
    R2("self_attn.kv_b_proj.weight", DIM_KV_B, DIM_KV_LORA, MLA_ANY, kv_b),
    R2("self_attn.o_proj.weight", DIM_HIDDEN, DIM_Q, STD_ATTN, o),
    R2("self_attn.o_proj.weight", DIM_HIDDEN, DIM_Q, FUSED_ATTN, o),
    R2("self_attn.o_proj.weight", DIM_HIDDEN, DIM_O_MLA, MLA_ANY, o),
    R1("self_attn.o_proj.bias", DIM_HIDDEN, O_BIAS, o_bias),
    R1("self_attn.q_norm.weight", DIM_HEAD, QK_NORM, q_norm),
    R1("self_attn.k_norm.weight", DIM_HEAD, QK_NORM, k_norm),
    R1("self_attn.sinks", DIM_HEADS, SINKS, sinks),
    R1("post_attention_layernorm.weight", DIM_HIDDEN, ALWAYS, post_norm),
    R1("pre_feedforward_layernorm.weight", DIM_HIDDEN, FF_NORMS, pre_ff_norm),
    R2("mlp.gate_proj.weight", DIM_INTER, DIM_HIDDEN, DENSE, gate),
    R1("mlp.gate_proj.bias", DIM_INTER, DENSE_BIAS, gate_bias),
    R2("mlp.up_proj.weight", DIM_INTER, DIM_HIDDEN, DENSE, up),
    R1("mlp.up_proj.bias", DIM_INTER, DENSE_BIAS, up_bias),
    R2("mlp.gate_up_proj.weight", DIM_INTER2, DIM_HIDDEN, DENSE_FUSED, gate_up),
    R2("mlp.down_proj.weight", DIM_HIDDEN, DIM_INTER, DENSE, down),
    R2("mlp.down_proj.weight", DIM_HIDDEN, DIM_INTER, DENSE_FUSED, down),
    R1("mlp.down_proj.bias", DIM_HIDDEN, DENSE_BIAS, down_bias),
    R2("block_sparse_moe.gate.weight", DIM_EXPERTS, DIM_HIDDEN, MOE_MIXTRAL, router),
    E2("block_sparse_moe.experts.*.w1.weight", DIM_MOE_INTER, DIM_HIDDEN, MOE_MIXTRAL, expert_gate),
    E2("block_sparse_moe.experts.*.w2.weight", DIM_HIDDEN, DIM_MOE_INTER, MOE_MIXTRAL, expert_down),
    E2("block_sparse_moe.experts.*.w3.weight", DIM_MOE_INTER, DIM_HIDDEN, MOE_MIXTRAL, expert_up),
    R2("mlp.gate.weight", DIM_EXPERTS, DIM_HIDDEN, MOE_ROUTER, router),
    {"mlp.gate.e_score_correction_bias",
     {DIM_EXPERTS, DIM_ONE, DIM_ONE},
     1,
     SCORE_BIAS,
     S(router_bias),
     false,
     false,
     true},
    E2("mlp.experts.*.gate_proj.weight", DIM_MOE_INTER, DIM_HIDDEN, MOE_EXPERTS, expert_gate),
    E2("mlp.experts.*.up_proj.weight", DIM_MOE_INTER, DIM_HIDDEN, MOE_EXPERTS, expert_up),
    E2("mlp.experts.*.down_proj.weight", DIM_HIDDEN, DIM_MOE_INTER, MOE_EXPERTS, expert_down),
    R2("mlp.shared_expert.gate_proj.weight", DIM_SHARED_INTER, DIM_HIDDEN, SHARED_QWEN, shared_gate),
    R2("mlp.shared_expert.up_proj.weight", DIM_SHARED_INTER, DIM_HIDDEN, SHARED_QWEN, shared_up),
    R2("mlp.shared_expert.down_proj.weight", DIM_HIDDEN, DIM_SHARED_INTER, SHARED_QWEN, shared_down),
    R2("mlp.shared_expert_gate.weight", DIM_ONE, DIM_HIDDEN, SHARED_GATE, shared_expert_gate),
    R2("mlp.shared_experts.gate_proj.weight", DIM_SHARED_INTER, DIM_HIDDEN, SHARED_DS, shared_gate),
    R2("mlp.shared_experts.up_proj.weight", DIM_SHARED_INTER, DIM_HIDDEN, SHARED_DS, shared_up),
    R2("mlp.shared_experts.down_proj.weight", DIM_HIDDEN, DIM_SHARED_INTER, SHARED_DS, shared_down),
    R2("mlp.router.weight", DIM_EXPERTS, DIM_HIDDEN, MOE_STACKED, router),
    R1("mlp.router.bias", DIM_EXPERTS, MOE_STACKED, router_bias),
    K3("mlp.experts.gate_up_proj", DIM_EXPERTS, DIM_HIDDEN, DIM_MOE_INTER2, MOE_STACKED, experts_gate_up),
    K2("mlp.experts.gate_up_proj_bias", DIM_EXPERTS, DIM_MOE_INTER2, MOE_STACKED_B, experts_gate_up_bias),
    K3("mlp.experts.down_proj", DIM_EXPERTS, DIM_MOE_INTER, DIM_HIDDEN, MOE_STACKED, experts_down),
    K2("mlp.experts.down_proj_bias", DIM_EXPERTS, DIM_HIDDEN, MOE_STACKED_B, experts_down_bias),
    R1("post_feedforward_layernorm.weight", DIM_HIDDEN, FF_NORMS, post_ff_norm),
};
#define NROWS (sizeof rows / sizeof rows[0])

static bool is_mla(const llama_config *c) { return c->mla.kv_lora_rank > 0; }

static bool present(const llama_config *c, bool sparse, when w) {
    const llama_family f = c->family;
    const bool std_attn = !is_mla(c) && !c->fused_proj, dense = !sparse && !c->fused_proj;
    switch (w) {
    case ALWAYS: return true;
    case STD_ATTN: return std_attn;
    case QKV_BIAS: return std_attn && c->qkv_bias;
    case O_BIAS: return !is_mla(c) && c->o_bias;
    case QK_NORM: return c->qk_norm;
    case SINKS: return c->sinks;
    case FUSED_ATTN: return !is_mla(c) && c->fused_proj;
    case MLA_ANY: return is_mla(c);
    case MLA_Q_LORA: return is_mla(c) && c->mla.q_lora_rank > 0;
    case MLA_Q_FULL: return is_mla(c) && c->mla.q_lora_rank == 0;
    case DENSE: return dense;
    case DENSE_BIAS: return dense && c->mlp_bias;
    case DENSE_FUSED: return !sparse && c->fused_proj;
    case FF_NORMS: return c->ff_norms;
    case MOE_MIXTRAL: return sparse && f == LLAMA_FAMILY_MIXTRAL;
    case MOE_ROUTER:
    case MOE_EXPERTS:
        return sparse && (f == LLAMA_FAMILY_QWEN2_MOE || f == LLAMA_FAMILY_QWEN3_MOE || f == LLAMA_FAMILY_DEEPSEEK_V3);
    case SCORE_BIAS: return sparse && c->moe.score_bias;
    case SHARED_QWEN: return sparse && f != LLAMA_FAMILY_DEEPSEEK_V3 && c->moe.shared_intermediate > 0;
    case SHARED_GATE: return sparse && c->moe.shared_gate;
    case SHARED_DS: return sparse && f == LLAMA_FAMILY_DEEPSEEK_V3 && c->moe.shared_intermediate > 0;
    case MOE_STACKED: return sparse && f == LLAMA_FAMILY_GPT_OSS;
    case MOE_STACKED_B: return sparse && f == LLAMA_FAMILY_GPT_OSS && c->moe.expert_bias;
    }
    return false;
}

bool llama_layer_moe(const llama_config *c, int64_t i) {
    const llama_moe *m = &c->moe;
    if (m->experts <= 0 || i < m->dense_first || (m->sparse_step > 1 && (i + 1) % m->sparse_step != 0)) return false;
    for (int k = 0; k < m->n_mlp_only; k++)
        if (m->mlp_only[k] == i) return false;
    return true;
}

// The rows of a group of per-expert rows starting at r, present or not, and how many are present.
static size_t group_end(const llama_config *c, bool sparse, size_t r, size_t *n_present) {
    size_t end = r;
    *n_present = 0;
    while (end < NROWS && rows[end].expert) *n_present += present(c, sparse, rows[end++].cond);
    return end;
}

// The routed experts this table holds in a sparse layer: all, or an expert-parallel rank's share.
static uint64_t experts_of(const llama_config *c) {
    if (c->moe.experts <= 0) return 0;
    return (uint64_t)(c->moe.ep > 1 ? c->moe.experts / c->moe.ep : c->moe.experts);
}

// Walks the rows of a layer (sparse or dense): the j-th tensor's row and expert (-1 for a row of
// its own); false past the last. With j SIZE_MAX it only counts (*count).
static bool locate(const llama_config *c, bool sparse, size_t j, const layer_row **row, int64_t *expert,
                   size_t *count) {
    size_t k = 0;
    for (size_t r = 0; r < NROWS;) {
        if (!rows[r].expert) {
            if (present(c, sparse, rows[r].cond) && k++ == j) {
                *row = &rows[r], *expert = -1;
                return true;
            }
            r++;
            continue;
        }
        size_t n, end = group_end(c, sparse, r, &n), span = n * experts_of(c);
        if (j != SIZE_MAX && j >= k && j < k + span) {
            size_t off = j - k, which = off % n;
            *expert = (int64_t)(off / n);
            for (size_t g = r; g < end; g++)
                if (present(c, sparse, rows[g].cond) && which-- == 0) *row = &rows[g];
            return true;
        }
        k += span;
        r = end;
    }
    if (count) *count = k;
    return false;
}

static size_t kind_count(const llama_config *c, bool sparse) {
    size_t n = 0;
    locate(c, sparse, SIZE_MAX, NULL, NULL, &n);
    return n;
}

size_t llama_layer_param_count(const llama_config *c, int64_t i) { return kind_count(c, llama_layer_moe(c, i)); }

// Every layer of one kind (dense, or all sparse): positions by multiplication.
static bool uniform(const llama_config *c) {
    const llama_moe *m = &c->moe;
    return m->experts <= 0 || (m->dense_first == 0 && m->sparse_step <= 1 && m->n_mlp_only == 0);
}

size_t llama_layer_first_param(const llama_config *c, int64_t i) {
    if (uniform(c)) return 1 + (size_t)(i < c->layers ? i : c->layers) * kind_count(c, c->moe.experts > 0);
    const size_t dense = kind_count(c, false), sparse = kind_count(c, true);
    size_t first = 1;
    for (int64_t l = 0; l < i && l < c->layers; l++) first += llama_layer_moe(c, l) ? sparse : dense;
    return first;
}

size_t llama_param_count_tensors(const llama_config *c) {
    if (c->layers < 0) return 0;
    return llama_layer_first_param(c, c->layers) + 1 + (c->tied ? 0 : 1);
}

// The size d stands for; false if it overflows.
static bool size_of(const llama_config *c, dim d, int64_t *out) {
    const llama_mla *m = &c->mla;
    int64_t t;
    switch (d) {
    case DIM_ONE: *out = 1; return true;
    case DIM_HIDDEN: *out = c->hidden; return true;
    case DIM_Q: return !__builtin_mul_overflow(c->heads, c->head_dim, out);
    case DIM_KV: return !__builtin_mul_overflow(c->kv_heads, c->head_dim, out);
    case DIM_INTER: *out = c->intermediate; return true;
    case DIM_INTER2: return !__builtin_mul_overflow(c->intermediate, 2, out);
    case DIM_HEAD: *out = c->head_dim; return true;
    case DIM_HEADS: *out = c->heads; return true;
    case DIM_QKV:
        return !__builtin_mul_overflow(c->kv_heads, 2, &t) && !__builtin_add_overflow(t, c->heads, &t) &&
               !__builtin_mul_overflow(t, c->head_dim, out);
    case DIM_EXPERTS: *out = c->moe.experts; return true;
    case DIM_MOE_INTER: *out = c->moe.intermediate; return true;
    case DIM_MOE_INTER2: return !__builtin_mul_overflow(c->moe.intermediate, 2, out);
    case DIM_SHARED_INTER: *out = c->moe.shared_intermediate; return true;
    case DIM_Q_LORA: *out = m->q_lora_rank; return true;
    case DIM_KV_LORA: *out = m->kv_lora_rank; return true;
    case DIM_KV_A: return !__builtin_add_overflow(m->kv_lora_rank, m->qk_rope, out);
    case DIM_Q_B:
        return !__builtin_add_overflow(m->qk_nope, m->qk_rope, &t) && !__builtin_mul_overflow(c->heads, t, out);
    case DIM_KV_B:
        return !__builtin_add_overflow(m->qk_nope, m->v_head, &t) && !__builtin_mul_overflow(c->heads, t, out);
    case DIM_O_MLA: return !__builtin_mul_overflow(c->heads, m->v_head, out);
    }
    return false;
}

// Parameter i's block (-1 outside) and its index there.
static int64_t layer_of(const llama_config *c, size_t i, size_t *j) {
    if (uniform(c)) {
        size_t per = kind_count(c, c->moe.experts > 0);
        if (i < 1 || per == 0 || (i - 1) / per >= (size_t)c->layers) return -1;
        *j = (i - 1) % per;
        return (int64_t)((i - 1) / per);
    }
    const size_t dense = kind_count(c, false), sparse = kind_count(c, true);
    size_t first = 1;
    for (int64_t l = 0; l < c->layers; l++) {
        size_t n = llama_layer_moe(c, l) ? sparse : dense;
        if (i >= first && i < first + n) {
            *j = i - first;
            return l;
        }
        first += n;
    }
    return -1;
}

static int put_name(char *dst, size_t len, int64_t layer, const char *row, int64_t expert) {
    const char *star = strchr(row, '*');
    int k = star ? snprintf(dst, len, "model.layers.%lld.%.*s%lld%s", (long long)layer, (int)(star - row), row,
                            (long long)expert, star + 1)
                 : snprintf(dst, len, "model.layers.%lld.%s", (long long)layer, row);
    return k < 0 || (size_t)k >= len ? -1 : 0;
}

int llama_param_info_of(const llama_config *c, size_t i, llama_param_info *out) {
    size_t n = llama_param_count_tensors(c), j;
    if (i >= n) return -1;
    memset(out, 0, sizeof *out);
    out->layer = out->expert = -1;
    for (int d = 0; d < LLAMA_PARAM_MAX_DIMS; d++) out->shape[d] = 1;
    if (i == 0 || (i == n - 1 && !c->tied)) {
        snprintf(out->name, sizeof out->name, i == 0 ? "model.embed_tokens.weight" : "lm_head.weight");
        out->ndim = 2, out->shape[0] = c->vocab, out->shape[1] = c->hidden;
        return 0;
    }
    int64_t l = layer_of(c, i, &j);
    if (l < 0) {
        snprintf(out->name, sizeof out->name, "model.norm.weight");
        out->ndim = 1, out->shape[0] = c->hidden;
        return 0;
    }
    const layer_row *r = NULL;
    int64_t e = -1;
    if (!locate(c, llama_layer_moe(c, l), j, &r, &e, NULL)) return -1;
    out->layer = l, out->expert = e, out->ndim = r->ndim, out->buffer = r->buffer, out->matrix = r->ndim >= 2;
    for (int d = 0; d < r->ndim; d++)
        if (!size_of(c, r->shape[d], &out->shape[d])) return -1;
    return put_name(out->name, sizeof out->name, l, r->name, e);
}

int llama_param_spec(const llama_config *c, size_t i, char *name, size_t name_len, int *ndim,
                     int64_t shape[LLAMA_PARAM_MAX_DIMS]) {
    llama_param_info p;
    if (llama_param_info_of(c, i, &p) != 0) return -1;
    int k = snprintf(name, name_len, "%s", p.name);
    *ndim = p.ndim;
    memcpy(shape, p.shape, sizeof p.shape);
    return (k < 0 || (size_t)k >= name_len) ? -1 : 0;
}

ag_tensor **llama_layer_slot(llama_layer *L, const llama_config *c, int64_t layer, size_t j) {
    const layer_row *r = NULL;
    int64_t e = -1;
    if (!locate(c, llama_layer_moe(c, layer), j, &r, &e, NULL)) return NULL;
    if (!r->expert) return (ag_tensor **)((char *)L + r->slot);
    ag_tensor **arr = *(ag_tensor ***)((char *)L + r->slot);
    return arr ? &arr[e] : NULL;
}

int llama_layer_alloc(llama_layer *L, const llama_config *c, int64_t layer) {
    bool sparse = llama_layer_moe(c, layer);
    for (size_t r = 0; r < NROWS; r++) {
        ag_tensor ***arr = (ag_tensor ***)((char *)L + rows[r].slot);
        if (!rows[r].expert || !present(c, sparse, rows[r].cond) || *arr) continue;
        if (!(*arr = calloc(experts_of(c), sizeof **arr))) return -1;
    }
    return 0;
}

void llama_layer_release(llama_layer *L) {
    free(L->expert_gate);
    free(L->expert_up);
    free(L->expert_down);
    L->expert_gate = L->expert_up = L->expert_down = NULL;
}

static bool mul_ovf(uint64_t a, uint64_t b, uint64_t *r) { return __builtin_mul_overflow(a, b, r); }
static bool add_ovf(uint64_t a, uint64_t b, uint64_t *r) { return __builtin_add_overflow(a, b, r); }

// The elements of a layer's rows (sparse or dense) of one kind: parameters (buffers false),
// buffers (true); routed: only the routed experts' rows. -1 on overflow.
static int layer_elements(const llama_config *c, bool sparse, bool buffers, bool routed, uint64_t *out) {
    uint64_t sum = 0;
    for (size_t r = 0; r < NROWS; r++) {
        if (!present(c, sparse, rows[r].cond) || rows[r].buffer != buffers) continue;
        if (routed && !rows[r].expert && !rows[r].stacked) continue;
        uint64_t e = rows[r].expert ? experts_of(c) : 1;
        for (int d = 0; d < rows[r].ndim; d++) {
            int64_t s;
            if (!size_of(c, rows[r].shape[d], &s) || s < 0 || mul_ovf(e, (uint64_t)s, &e)) return -1;
        }
        if (add_ovf(sum, e, &sum)) return -1;
    }
    *out = sum;
    return 0;
}

// Sums a per-layer figure over the layers; -1 on overflow.
static int over_layers(const llama_config *c, uint64_t dense, uint64_t sparse, uint64_t *out) {
    uint64_t nsparse = 0, t, u;
    for (int64_t l = 0; l < c->layers; l++) nsparse += llama_layer_moe(c, l);
    if (mul_ovf(dense, (uint64_t)c->layers - nsparse, &t) || mul_ovf(sparse, nsparse, &u) || add_ovf(t, u, out))
        return -1;
    return 0;
}

int llama_param_total(const llama_config *c, uint64_t *out) {
    const int64_t v[] = {c->hidden,
                         c->intermediate,
                         c->layers,
                         c->heads,
                         c->kv_heads,
                         c->head_dim,
                         c->vocab,
                         c->moe.experts,
                         c->moe.intermediate,
                         c->moe.shared_intermediate,
                         c->mla.q_lora_rank,
                         c->mla.kv_lora_rank,
                         c->mla.qk_nope,
                         c->mla.qk_rope,
                         c->mla.v_head};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        if (v[i] < 0) return -1;
    uint64_t dense, sparse, t, embed;
    if (layer_elements(c, false, false, false, &dense) != 0 || layer_elements(c, true, false, false, &sparse) != 0 ||
        over_layers(c, dense, sparse, &t) != 0)
        return -1;
    // the blocks, the embedding, the final norm, and an untied head
    if (mul_ovf((uint64_t)c->vocab, (uint64_t)c->hidden, &embed) || add_ovf(t, embed, &t) ||
        add_ovf(t, (uint64_t)c->hidden, &t) || (!c->tied && add_ovf(t, embed, &t)))
        return -1;
    *out = t;
    return 0;
}

uint64_t llama_param_count(const llama_config *c) {
    uint64_t total;
    return llama_param_total(c, &total) == 0 ? total : 0;
}

uint64_t llama_buffer_count(const llama_config *c) {
    uint64_t sparse, total;
    if (layer_elements(c, true, true, false, &sparse) != 0 || over_layers(c, 0, sparse, &total) != 0) return 0;
    return total;
}

uint64_t llama_active_param_count(const llama_config *c) {
    uint64_t total = llama_param_count(c), routed, idle;
    const uint64_t E = experts_of(c), k = (uint64_t)(c->moe.top_k > 0 ? c->moe.top_k : 0);
    if (E == 0 || k >= E || layer_elements(c, true, false, true, &routed) != 0) return total;
    // the routed experts a token does not visit: (E - k) of every E
    if (over_layers(c, 0, routed / E * (E - k), &idle) != 0 || idle > total) return total;
    return total - idle;
}

float llama_embedding_scale(const llama_config *c) { return c->embed_scale ? (float)sqrt((double)c->hidden) : 1.0f; }

float llama_attention_scale(const llama_config *c) {
    // query_pre_attn_scalar equal to head_dim is the plain scale (Gemma-3-1B's 256)
    return c->query_scalar > 0.0 && c->query_scalar != (double)c->head_dim ? (float)(1.0 / sqrt(c->query_scalar))
                                                                           : 0.0f;
}

uint64_t llama_kv_cache_elems_per_token(const llama_config *c) {
    const llama_mla *m = &c->mla;
    if (m->kv_lora_rank > 0 && m->latent_cache) return (uint64_t)c->layers * (uint64_t)(m->kv_lora_rank + m->qk_rope);
    if (m->kv_lora_rank > 0)
        return (uint64_t)c->layers * (uint64_t)c->heads * (uint64_t)(m->qk_nope + m->qk_rope + m->v_head);
    return 2 * (uint64_t)c->layers * (uint64_t)c->kv_heads * (uint64_t)c->head_dim;
}

const char *llama_kv_cache_formula(const llama_config *c, char *buf, size_t cap) {
    const llama_mla *m = &c->mla;
    if (m->kv_lora_rank > 0 && m->latent_cache)
        snprintf(buf, cap, "%lld layers x (%lld latent + %lld rope keys)", (long long)c->layers,
                 (long long)m->kv_lora_rank, (long long)m->qk_rope);
    else if (m->kv_lora_rank > 0)
        snprintf(buf, cap, "%lld layers x %lld heads x (%lld + %lld keys + %lld values)", (long long)c->layers,
                 (long long)c->heads, (long long)m->qk_nope, (long long)m->qk_rope, (long long)m->v_head);
    else
        snprintf(buf, cap, "2 x %lld layers x %lld kv heads x %lld", (long long)c->layers, (long long)c->kv_heads,
                 (long long)c->head_dim);
    return buf;
}

float llama_mla_scale(const llama_config *c) {
    const llama_rope_scaling *r = &c->rope;
    double scale = 1.0 / sqrt((double)(c->mla.qk_nope + c->mla.qk_rope));
    if (r->type != LLAMA_ROPE_DEFAULT && r->mscale_all_dim != 0.0 && r->factor > 1.0) {
        const double m = 0.1 * r->mscale_all_dim * log(r->factor) + 1.0;
        scale *= m * m;
    }
    return (float)scale;
}

ag_rope_freqs llama_layer_rope_freqs(const llama_config *c, int64_t i, int64_t positions) {
    if (c->rope_local_theta > 0.0 && llama_layer_window(c, i) > 0)
        return (ag_rope_freqs){(float)c->rope_local_theta, NULL, 1.0f};
    return llama_rope_freqs_at(c, positions);
}

int64_t llama_layer_window(const llama_config *c, int64_t i) {
    if (c->sliding_window > 0 && c->full_every > 0) return (i + 1) % c->full_every ? c->sliding_window : 0;
    if (c->window_period > 0) return (i + 1) % c->window_period ? c->sliding_window : 0;
    return c->sliding_window > 0 && i >= c->window_from ? c->sliding_window : 0;
}
