// The frameworks' rows: what each one allocates, keeps and frees, one field a decision. A new
// framework is a new row; `membill help frameworks` prints them from the field texts below.
#include <stdatomic.h>
#include <stdint.h>

#include "ag_internal.h"

static const ag_framework_row rows[AG_NFRAMEWORKS] = {
    [AG_FRAMEWORK_LEAN] =
        {
            .name = "lean",
            .text = "lean (minimal saved sets: fused RMSNorm, GQA-aware attention, fused cross-entropy)",
            .brief = "minimal saved sets, as fused kernels keep",
            .typed_tensors = false,
            .leaf_sum_out_of_place = false,
            .rmsnorm = AG_RMSNORM_X_RSTD,
            .attention = AG_ATTENTION_OPS_FUSED,
            .kv_heads = AG_KV_READ,
            .flash = AG_FLASH_FUSED,
            .flash_available = true,
            .loss = AG_LOSS_FUSED,
            .dropout_mask = false,
            .dequantize_whole = false,
            .autocast = false,
            .kv_cache_cat = false,
            .prefill_last_logits = false,
            .mask = AG_MASK_NONE,
            .rope_tables = false,
            .output_cache = false,
            .output_holds_hidden = false,
            .checkpoint_args = AG_CKPT_ARGS_NONE,
            .checkpoint_rng_state = false,
            .adam_foreach = AG_FOREACH_CURRENT,
            .zero_grad_first = false,
            .moe = AG_MOE_GROUPED,
            .node_sum_out_of_place = false,
            .fused_split = AG_FUSED_SPLIT_KERNEL,
        },
    [AG_FRAMEWORK_PYTORCH] =
        {
            .name = "pytorch",
            .text = "pytorch (Hugging Face transformers' LlamaForCausalLM on current PyTorch)",
            .brief = "HF transformers on current PyTorch, eager attention",
            .typed_tensors = true,
            .leaf_sum_out_of_place = true,
            .rmsnorm = AG_RMSNORM_HF,
            .attention = AG_ATTENTION_OPS_HF_EAGER,
            .kv_heads = AG_KV_REPEAT_KV,
            .flash = AG_FLASH_SDPA,
            .flash_available = true,
            .loss = AG_LOSS_HF,
            .dropout_mask = true,
            .dequantize_whole = true,
            .autocast = true,
            .kv_cache_cat = true,
            .prefill_last_logits = true,
            .mask = AG_MASK_B_T_T,
            .rope_tables = true,
            .output_cache = true,
            .output_holds_hidden = true,
            .checkpoint_args = AG_CKPT_ARGS_HELD,
            .checkpoint_rng_state = true,
            .adam_foreach = AG_FOREACH_CURRENT,
            .zero_grad_first = true,
            .moe = AG_MOE_HF_EAGER,
            .node_sum_out_of_place = false,
            .fused_split = AG_FUSED_SPLIT_HF,
        },
    [AG_FRAMEWORK_PYTORCH_113] =
        {
            .name = "pytorch-1.13",
            .text = "pytorch-1.13 (Hugging Face transformers' LlamaForCausalLM on PyTorch 1.13)",
            .brief = "the same on PyTorch 1.13",
            .typed_tensors = true,
            .leaf_sum_out_of_place = true,
            .rmsnorm = AG_RMSNORM_HF_SQUARES,
            .attention = AG_ATTENTION_OPS_HF_EAGER,
            .kv_heads = AG_KV_REPEAT_KV,
            .flash = AG_FLASH_SDPA,
            .flash_available = false,
            .loss = AG_LOSS_HF,
            .dropout_mask = true,
            .dequantize_whole = true,
            .autocast = true,
            .kv_cache_cat = true,
            .prefill_last_logits = true,
            .mask = AG_MASK_T_T1,
            .rope_tables = true,
            .output_cache = true,
            .output_holds_hidden = true,
            .checkpoint_args = AG_CKPT_ARGS_SAVED,
            .checkpoint_rng_state = true,
            .adam_foreach = AG_FOREACH_113,
            .zero_grad_first = true,
            .moe = AG_MOE_HF_EAGER,
            .node_sum_out_of_place = true,
            .fused_split = AG_FUSED_SPLIT_HF,
        },
    [AG_FRAMEWORK_PYTORCH_20] =
        {
            .name = "pytorch-2.0",
            .text = "pytorch-2.0 (Hugging Face transformers' LlamaForCausalLM on PyTorch 2.0)",
            .brief = "the 1.13 row with PyTorch 2.0's SDPA and torch.optim",
            .typed_tensors = true,
            .leaf_sum_out_of_place = true,
            .rmsnorm = AG_RMSNORM_HF_SQUARES,
            .attention = AG_ATTENTION_OPS_HF_EAGER,
            .kv_heads = AG_KV_REPEAT_KV,
            .flash = AG_FLASH_SDPA,
            .flash_available = true,
            .loss = AG_LOSS_HF,
            .dropout_mask = true,
            .dequantize_whole = true,
            .autocast = true,
            .kv_cache_cat = true,
            .prefill_last_logits = true,
            .mask = AG_MASK_T_T1,
            .rope_tables = true,
            .output_cache = true,
            .output_holds_hidden = true,
            .checkpoint_args = AG_CKPT_ARGS_SAVED,
            .checkpoint_rng_state = true,
            .adam_foreach = AG_FOREACH_20,
            .zero_grad_first = true,
            .moe = AG_MOE_HF_EAGER,
            .node_sum_out_of_place = true,
            .fused_split = AG_FUSED_SPLIT_HF,
        },
    [AG_FRAMEWORK_PYTORCH_20_QWEN] =
        {
            .name = "pytorch-2.0-qwen",
            .text = "pytorch-2.0-qwen (the pytorch-2.0 row with Qwen (v1)'s own loss, modeling_qwen.py's)",
            .brief = "pytorch-2.0 with Qwen (v1)'s loss on the logits' own dtype",
            .typed_tensors = true,
            .leaf_sum_out_of_place = true,
            .rmsnorm = AG_RMSNORM_HF_SQUARES,
            .attention = AG_ATTENTION_OPS_HF_EAGER,
            .kv_heads = AG_KV_REPEAT_KV,
            .flash = AG_FLASH_SDPA,
            .flash_available = true,
            .loss = AG_LOSS_SHIFTED,
            .dropout_mask = true,
            .dequantize_whole = true,
            .autocast = true,
            .kv_cache_cat = true,
            .prefill_last_logits = true,
            .mask = AG_MASK_T_T1,
            .rope_tables = true,
            .output_cache = true,
            .output_holds_hidden = true,
            .checkpoint_args = AG_CKPT_ARGS_SAVED,
            .checkpoint_rng_state = true,
            .adam_foreach = AG_FOREACH_20,
            .zero_grad_first = true,
            .moe = AG_MOE_HF_EAGER,
            .node_sum_out_of_place = true,
            .fused_split = AG_FUSED_SPLIT_HF,
        },
};

const ag_framework_row *ag_framework_row_of(ag_framework f) { return (unsigned)f < AG_NFRAMEWORKS ? &rows[f] : NULL; }

ag_kv_layout ag_eager_kv_layout(const ag_framework_row *r, int64_t B, int Hq, int Hkv) {
    if (AG_FW(r, kv_heads) == AG_KV_READ) return AG_KV_IN_PLACE;
    // repeat_kv: expand + reshape copies, unless the expanded dimension is one head (its reshape is
    // then a view, stride 0 along the query heads) or there is none to expand (it returns its input)
    if (Hq > Hkv && Hkv > 1) return AG_KV_REPEATED;
    // a matmul views that as a batch of matrices only at batch 1
    return B > 1 ? AG_KV_MATMUL_COPIES : AG_KV_IN_PLACE;
}

// ---- the fields in words ----

typedef struct {
    const char *name, *doc;
    const char *values[3]; // by the field's value (false, true for a flag); NULL: the value is text
} field_text;

static const field_text texts[AG_FW_NFIELDS] = {
    [AG_FWF_name] = {"name", "--framework NAME", {NULL}},
    [AG_FWF_text] = {"text", "what the report says it bills", {NULL}},
    [AG_FWF_brief] = {"brief", "--framework's help", {NULL}},
    [AG_FWF_typed_tensors] = {"typed_tensors",
                              "element sizes",
                              {"every activation and gradient at the run's activation dtype",
                               "each tensor at its own dtype, as type promotion gives it (a gradient at its "
                               "tensor's)"}},
    [AG_FWF_leaf_sum_out_of_place] = {"leaf_sum_out_of_place",
                                      "a leaf reached by two nodes (a tied embedding)",
                                      {"accumulates into .grad in place",
                                       "each gradient a buffer of its own, summed out of place (the engine's input "
                                       "buffer: 3 leaf-sized at the sum), a node's own gradient dropped first"}},
    [AG_FWF_rmsnorm] = {"rmsnorm",
                        "what RMSNorm keeps for backward",
                        {"x and a float32 rstd a row",
                         "x, rstd, x * rstd (the weight's mul), w * x (the next linear's input); x.to(float32) "
                         "in a 16-bit model",
                         "the same and x² (1.13's MeanBackward1 keeps its input)"}},
    [AG_FWF_attention] = {"attention",
                          "eager attention",
                          {"one op: q, k, v and the probabilities kept",
                           "transformers' eager_attention_forward: the scores made three times (matmul, * scaling, "
                           "+ mask), the float32 probabilities and the 8-byte scaling scalar kept, q kept (a "
                           "contiguous copy when batch > 1)"}},
    [AG_FWF_kv_heads] = {"kv_heads",
                         "k and v as the eager products take them",
                         {"the key-value heads, read in place",
                          "repeat_kv: copies at every query head when grouped, kept by the two matmuls; the heads "
                          "themselves without grouping or with one key-value head (a view), the matmuls' own copies "
                          "when batch > 1"}},
    [AG_FWF_flash] = {"flash",
                      "flash attention (--attention flash)",
                      {"q, k, v, the output and a float32 log-sum-exp a row kept",
                       "SDPA: q, k, v, its own [B, heads, T, D] output (beside transformers' transposed copy) and "
                       "the log-sum-exp kept; its operands cast to 16 bits under autocast"}},
    [AG_FWF_flash_available] = {"flash_available",
                                "--attention flash",
                                {"refused: PyTorch 1.13 has no scaled_dot_product_attention (plan still compares it)",
                                 "runs"}},
    [AG_FWF_loss] = {"loss",
                     "the next-token loss",
                     {"logits and a float32 log-sum-exp a row kept",
                      "ForCausalLMLoss: a float32 log_softmax of every row, the padded int64 labels and "
                      "total_weight kept; nll_loss's and log_softmax's dense gradients in backward",
                      "Qwen (v1)'s CrossEntropyLoss on lm_logits[..., :-1, :].contiguous() in the logits' own dtype "
                      "(a copy when batch > 1; float32 under autocast): its log_softmax and the shifted int64 labels "
                      "kept; nll_loss's and log_softmax's gradients, then SliceBackward's zeros of the whole "
                      "logits, in backward"}},
    [AG_FWF_dropout_mask] = {"dropout_mask",
                             "dropout (LoRA's)",
                             {"the mask drawn again in backward", "a one-byte mask an element kept"}},
    [AG_FWF_dequantize_whole] = {"dequantize_whole",
                                 "a 4-bit base weight in a product",
                                 {"dequantised 64 rows at a time in a kernel's workspace",
                                  "dequantised whole into a temporary, forward and backward (bitsandbytes)"}},
    [AG_FWF_autocast] = {"autocast",
                         "--dtype autocast-bf16",
                         {"not this framework's semantics",
                          "torch.autocast: each product's 16-bit casts of its operands kept for backward"}},
    [AG_FWF_kv_cache_cat] = {"kv_cache_cat",
                             "the KV cache of generation",
                             {"a chunk per forward, nothing copied",
                              "DynamicCache: torch.cat per step, the layer's cache held twice for a moment"}},
    [AG_FWF_prefill_last_logits] = {"prefill_last_logits",
                                    "a generation's prefill",
                                    {"the logits of every position",
                                     "the last position's logits only (generate's logits_to_keep=1)"}},
    [AG_FWF_mask] = {"mask",
                     "the causal mask the model makes",
                     {"none (the attention applies the pattern)",
                      "[T, T + 1] (transformers 4.4x, no attention mask given)",
                      "[B, 1, T, T] (a second one for Qwen's sliding layers)"}},
    [AG_FWF_rope_tables] = {"rope_tables",
                            "RoPE's angles",
                            {"recomputed from the positions, nothing kept",
                             "cos and sin [1, T, head_dim] made once a forward, kept by every layer's RoPE"}},
    [AG_FWF_output_cache] = {"output_cache",
                             "the training forward's output",
                             {"the logits", "the logits and a DynamicCache (k after RoPE, v), until dropped"}},
    [AG_FWF_output_holds_hidden] = {"output_holds_hidden",
                                    "the last hidden state",
                                    {"freed once lm_head has it",
                                     "held by the base model's output until the loss is made"}},
    [AG_FWF_checkpoint_args] = {"checkpoint_args",
                                "--checkpointing: what each layer keeps beside its input",
                                {"nothing",
                                 "transformers 4.4x: the causal mask and the positions saved (gone once the layer's "
                                 "backward ran), cos and sin kept by the node until the loss goes",
                                 "GradientCheckpointingLayer: the mask, the positions, cos and sin kept by the node "
                                 "until the loss goes"}},
    [AG_FWF_checkpoint_rng_state] = {"checkpoint_rng_state",
                                     "--checkpointing's random state",
                                     {"none",
                                      "preserve_rng_state: torch.get_rng_state() (5,056 bytes) per layer, until the "
                                      "loss goes"}},
    [AG_FWF_adam_foreach] = {"adam_foreach",
                             "--adam-impl foreach's temporaries",
                             {"current torch.optim: sqrt of every exp_avg_sq (W), divided and eps added in place",
                              "torch.optim 1.13: the eps sum out of place, a second list (2W)",
                              "torch.optim 2.0: the eps sum out of place (2W), and Adam's L2 sum a third list"}},
    [AG_FWF_zero_grad_first] = {"zero_grad_first",
                                "zero_grad (set_to_none)",
                                {"after the optimizer step",
                                 "opens the step, a phase of its own (the Trainer's loop)"}},
    [AG_FWF_moe] =
        {"moe",
         "a mixture of experts' router and experts",
         {"the router's float32 softmax kept; one grouped dispatch of the experts keeping each routed pair's "
          "gate and up outputs, the rest recomputed in backward",
          "transformers' sparse block op by op: topk's int64 indices, the sum and the values before `/=` "
          "kept; one_hot, nonzero and the eager loop over the experts hit (torch.where's indices, the "
          "gathered rows, the SwiGLU, the weighting, index_add_ keeping its source), IndexBackward's "
          "new_zeros of the source in backward"}},
    [AG_FWF_node_sum_out_of_place] =
        {"node_sum_out_of_place",
         "a node's gradient an op made apart (IndexBackward's new_zeros) when one is there",
         {"added into it in place", "summed with it out of place (1.13's input buffer: 3 at the sum)"}},
    [AG_FWF_fused_split] = {"fused_split",
                            "a fused projection's output (Phi-3's qkv_proj, gate_up_proj) split into its parts",
                            {"views sharing one gradient; the value part copied out, so that attention keeps it "
                             "alone",
                             "transformers' slices and chunk: views keeping the whole output alive while any is "
                             "kept; each slice's gradient output-sized (SliceBackward), the chunk's one "
                             "(SplitBackward)"}},
};

const char *ag_framework_field_name(ag_framework_field f) { return (unsigned)f < AG_FW_NFIELDS ? texts[f].name : NULL; }

const char *ag_framework_field_doc(ag_framework_field f) { return (unsigned)f < AG_FW_NFIELDS ? texts[f].doc : NULL; }

// The field's value as an index into its texts (a flag: 0 or 1), or -1 for a text field.
static int value_index(const ag_framework_row *r, ag_framework_field f) {
    switch (f) {
#define AG_FW_VALUE(type, field)                                                                                       \
    case AG_FWF_##field: return _Generic(r->field, const char * : -1, default : (int)(intptr_t)r->field);
        AG_FW_FIELDS(AG_FW_VALUE)
#undef AG_FW_VALUE
    default: return -1;
    }
}

// A text field's own words; NULL for the others.
static const char *own_text(const ag_framework_row *r, ag_framework_field f) {
    switch (f) {
#define AG_FW_TEXT(type, field)                                                                                        \
    case AG_FWF_##field: return _Generic(r->field, const char * : (const char *)(intptr_t)r->field, default : NULL);
        AG_FW_FIELDS(AG_FW_TEXT)
#undef AG_FW_TEXT
    default: return NULL;
    }
}

const char *ag_framework_field_value(const ag_framework_row *row, ag_framework_field f) {
    if (!row || (unsigned)f >= AG_FW_NFIELDS) return NULL;
    int v = value_index(row, f);
    if (v < 0) return own_text(row, f);
    return v < 3 ? texts[f].values[v] : NULL;
}

// ---- which fields code reads ----

static atomic_bool read_flags[AG_FW_NFIELDS];

void ag_framework_mark(ag_framework_field f) {
    if ((unsigned)f < AG_FW_NFIELDS) atomic_store_explicit(&read_flags[f], true, memory_order_relaxed);
}

bool ag_framework_field_read(ag_framework_field f) {
    return (unsigned)f < AG_FW_NFIELDS && atomic_load_explicit(&read_flags[f], memory_order_relaxed);
}
