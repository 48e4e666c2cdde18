// The saved set after a forward, by the role each tensor plays in a transformers Llama block: the
// names tests/reference/profile_step.py gives PyTorch's own allocations, so the two compare.
#include "cli.h"

#include <stdlib.h>
#include <string.h>

static const char *const role_names[CLI_NROLES] = {"autocast_weight_cast",
                                                   "embed",
                                                   "norm",
                                                   "residual",
                                                   "attn_qkv",
                                                   "attn_rope",
                                                   "attn_repeat_kv",
                                                   "attn_probs",
                                                   "attn_context",
                                                   "mlp",
                                                   "final_norm",
                                                   "logits",
                                                   "loss",
                                                   "rope_cos_sin",
                                                   "lora",
                                                   "cache",
                                                   "mask",
                                                   "moe",
                                                   "other"};

const char *cli_role_name(int role) { return role >= 0 && role < CLI_NROLES ? role_names[role] : "?"; }

static bool has(const char *s, const char *part) { return strstr(s, part) != NULL; }

// By the op's site label (autograd.h: "<prefix>:<what>"). cache: the forward's output holds a
// DynamicCache, so the k (after RoPE) and v that attention keeps as they are are its tensors.
static int role_of(const char *label, bool cache) {
    if (has(label, ":weight_bf16") || has(label, ":bias_bf16")) return CLI_ROLE_AUTOCAST_WEIGHT_CAST;
    if (!strncmp(label, "embed_tokens:", 13)) return CLI_ROLE_EMBED;
    if (!strncmp(label, "norm:", 5)) return CLI_ROLE_FINAL_NORM;
    if (!strncmp(label, "rotary_emb:", 11)) return CLI_ROLE_ROPE_COS_SIN;
    if (!strncmp(label, "loss:", 5)) return CLI_ROLE_LOSS;
    if (!strncmp(label, "lm_head:", 8)) return CLI_ROLE_LOGITS;
    if (!strncmp(label, "causal_mask", 11) || !strncmp(label, "cache_position", 14)) return CLI_ROLE_MASK;
    if (strncmp(label, "layers.", 7)) return CLI_ROLE_OTHER;
    if (has(label, ".lora_")) return CLI_ROLE_LORA;
    if (has(label, "layernorm:") || has(label, "q_norm:") || has(label, "k_norm:")) return CLI_ROLE_NORM; // Qwen3's
    // a sparse block: Mixtral's block_sparse_moe, Qwen's mlp router, experts and shared expert
    if (has(label, ".block_sparse_moe") || has(label, ".mlp.route") || has(label, ".mlp.experts.") ||
        has(label, ".mlp.gate:") || has(label, ".mlp.shared") || has(label, ".mlp:"))
        return CLI_ROLE_MOE;
    if (has(label, "_residual:")) return CLI_ROLE_RESIDUAL;
    if (has(label, ".mlp.")) return CLI_ROLE_MLP;
    if (cache && (has(label, "self_attn.k_rope:out") || has(label, "self_attn.v_proj:out"))) return CLI_ROLE_CACHE;
    if (has(label, "_rope:")) return CLI_ROLE_ATTN_ROPE;
    if (has(label, "_proj:")) return CLI_ROLE_ATTN_QKV; // q, k, v projections (o_proj's output is not saved)
    if (has(label, ":k_repeated") || has(label, ":v_repeated")) return CLI_ROLE_ATTN_REPEAT_KV;
    if (has(label, ":probs_bf16") || has(label, ":v_bmm")) return CLI_ROLE_ATTN_CONTEXT; // probs @ v's operands
    if (has(label, ":probs") || has(label, ":scaling") || has(label, ":q_bmm") || has(label, ":k_bmm") ||
        has(label, ":q_bf16") || has(label, ":k_bf16"))
        return CLI_ROLE_ATTN_PROBS;
    if (has(label, "self_attn:out") || has(label, ":sdpa_out")) return CLI_ROLE_ATTN_CONTEXT;
    if (has(label, "self_attn:lse")) return CLI_ROLE_ATTN_PROBS; // flash keeps these rows instead
    return CLI_ROLE_OTHER;
}

static int cmp_ptr(const void *a, const void *b) {
    uintptr_t x = (uintptr_t) * (const void *const *)a, y = (uintptr_t) * (const void *const *)b;
    return (x > y) - (x < y);
}

int cli_saved_by_role(const ag_ctx *ctx, uint64_t bytes[CLI_NROLES]) {
    memset(bytes, 0, CLI_NROLES * sizeof bytes[0]);
    size_t n = ag_tape_size(ctx), count = 0;
    const ag_tensor **all = malloc((n * AG_MAX_SAVED + 1) * sizeof *all);
    if (!all) return -1;
    for (size_t i = 0; i < n; i++) {
        ag_node_info info;
        if (!ag_tape_node(ctx, i, &info)) continue;
        for (int j = 0; j < info.nsaved; j++)
            if (info.saved[j]->block.category == MP_ACTIVATION) all[count++] = info.saved[j];
    }
    qsort(all, count, sizeof *all, cmp_ptr); // a tensor saved by several nodes counts once
    // (SDPA keeps them as they are too; their roles stay those of the ops that made them)
    const bool cache = AG_FW(ag_ctx_framework_row(ctx), output_cache) && ag_ctx_attention(ctx) == AG_ATTENTION_EAGER;
    for (size_t i = 0; i < count; i++)
        if (i == 0 || all[i] != all[i - 1]) bytes[role_of(ag_tensor_name(all[i]), cache)] += all[i]->block.bytes;
    free(all);
    return 0;
}
