"""Hugging Face LlamaForCausalLM, eager path, as torch.nn modules (torch only).

The op sequence follows transformers' modeling_llama.py (the 4.4x-4.5x eager code: rotary
embedding computed once per forward as cos/sin of shape [B, T, head_dim], eager_attention_forward
with repeat_kv, a float causal mask added to the scores, softmax in float32, ForCausalLMLoss with
labels padded by -100 then shifted, a DynamicCache when use_cache) op for op, so that every
tensor PyTorch allocates, saves for backward or frees is the one transformers would. It exists
to measure memory (tests/reference/profile_step.py); llama_ref.py stays the numerical reference.

Differences with transformers that change no allocation: no config object beyond the fields
used, no output_attentions / output_hidden_states / flash or sdpa paths
(with PyTorch 1.13 transformers picks "eager" anyway: there is no scaled_dot_product_attention),
no pretraining_tp > 1, no rope scaling, no sliding windows (the embedding's padding_idx is
pad_token_id, as transformers sets it). Gradient checkpointing is transformers 4.4x's:
LlamaModel.gradient_checkpointing set and the model in train mode turn use_cache off and run each
layer through torch.utils.checkpoint.checkpoint(layer.__call__, hidden_states, causal_mask,
position_ids, past_key_values, output_attentions, use_cache, cache_position, position_embeddings,
use_reentrant=True) (Trainer's default: reentrant, preserve_rng_state). The Qwen3 variant is the same module
tree with Qwen3Attention's differences: q, k, v and o_proj biases (attention_bias) and q_norm /
k_norm (Qwen3RMSNorm over each head) applied to q_proj(x).view(...) before the transpose. The embedding has no padding_idx (it only zeroes one row
of the gradient in place).

scope(name) wraps each module's work in a profiler record_function range when TRACE is set, so
that the profiler can attribute allocations to the module that made them.
"""
import contextlib

import torch
import torch.nn as nn
import torch.utils.checkpoint
import torch.nn.functional as F

TRACE = False


def scope(name):
    if TRACE:
        return torch.profiler.record_function(name)
    return contextlib.nullcontext()


class DynamicCache:
    """transformers.cache_utils.DynamicCache: per layer the key and value states [B, KV, S, hd].
    The first update of a layer stores the tensors it is given (no copy); later ones cat."""

    def __init__(self):
        self.key_cache = []
        self.value_cache = []

    def update(self, key_states, value_states, layer_idx):
        if len(self.key_cache) <= layer_idx:
            self.key_cache.append(key_states)
            self.value_cache.append(value_states)
        else:
            self.key_cache[layer_idx] = torch.cat([self.key_cache[layer_idx], key_states], dim=-2)
            self.value_cache[layer_idx] = torch.cat([self.value_cache[layer_idx], value_states],
                                                    dim=-2)
        return self.key_cache[layer_idx], self.value_cache[layer_idx]

    def get_seq_length(self, layer_idx=0):
        if len(self.key_cache) <= layer_idx:
            return 0
        return self.key_cache[layer_idx].shape[-2]


class LlamaRMSNorm(nn.Module):
    def __init__(self, hidden_size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class LlamaRotaryEmbedding(nn.Module):
    """Default rope: inv_freq buffer; forward gives cos, sin [B, T, hd] in x's dtype."""

    def __init__(self, cfg):
        super().__init__()
        dim = cfg.head_dim
        inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float()
                                             / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.attention_scaling = 1.0

    @torch.no_grad()
    def forward(self, x, position_ids):
        inv_freq_expanded = self.inv_freq[None, :, None].float().expand(position_ids.shape[0],
                                                                        -1, 1)
        position_ids_expanded = position_ids[:, None, :].float()
        with torch.autocast(device_type=x.device.type, enabled=False):
            freqs = (inv_freq_expanded.float() @ position_ids_expanded.float()).transpose(1, 2)
            emb = torch.cat((freqs, freqs), dim=-1)
            cos = emb.cos()
            sin = emb.sin()
        cos = cos * self.attention_scaling
        sin = sin * self.attention_scaling
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed


class LlamaMLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h, i = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, x):
        with scope("mlp"):
            return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


def repeat_kv(hidden_states, n_rep):
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep,
                                                           slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


def eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0):
    with scope("attn.repeat_kv"):
        key_states = repeat_kv(key, module.num_key_value_groups)
        value_states = repeat_kv(value, module.num_key_value_groups)
    with scope("attn.probs"):
        attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
        if attention_mask is not None:
            causal_mask = attention_mask[:, :, :, : key_states.shape[-2]]
            attn_weights = attn_weights + causal_mask
        attn_weights = F.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
        attn_weights = F.dropout(attn_weights, p=dropout, training=module.training)
    with scope("attn.context"):
        attn_output = torch.matmul(attn_weights, value_states)
        attn_output = attn_output.transpose(1, 2).contiguous()
    return attn_output, attn_weights


class LlamaAttention(nn.Module):
    def __init__(self, cfg, layer_idx):
        super().__init__()
        self.layer_idx = layer_idx
        self.head_dim = cfg.head_dim
        self.num_key_value_groups = cfg.num_attention_heads // cfg.num_key_value_heads
        self.scaling = self.head_dim ** -0.5
        self.attention_dropout = 0.0
        h, nq = cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim
        nkv = cfg.num_key_value_heads * cfg.head_dim
        self.q_proj = nn.Linear(h, nq, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(h, nkv, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(h, nkv, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(nq, h, bias=cfg.o_bias)
        self.qk_norm = cfg.qk_norm
        if cfg.qk_norm:  # Qwen3Attention
            self.q_norm = LlamaRMSNorm(self.head_dim, cfg.rms_norm_eps)
            self.k_norm = LlamaRMSNorm(self.head_dim, cfg.rms_norm_eps)

    def forward(self, hidden_states, position_embeddings, attention_mask, past_key_value=None):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        with scope("attn.qkv"):
            query_states = self.q_proj(hidden_states).view(hidden_shape)
            key_states = self.k_proj(hidden_states).view(hidden_shape)
            value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        if self.qk_norm:
            with scope("norm"):
                query_states = self.q_norm(query_states)
                key_states = self.k_norm(key_states)
        query_states, key_states = query_states.transpose(1, 2), key_states.transpose(1, 2)
        with scope("attn.rope"):
            cos, sin = position_embeddings
            query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)
        if past_key_value is not None:
            key_states, value_states = past_key_value.update(key_states, value_states,
                                                             self.layer_idx)
        attn_output, attn_weights = eager_attention_forward(
            self, query_states, key_states, value_states, attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout, scaling=self.scaling)
        with scope("attn.o_proj"):
            attn_output = attn_output.reshape(*input_shape, -1).contiguous()
            attn_output = self.o_proj(attn_output)
        return attn_output, attn_weights


class MixtralBlockSparseTop2MLP(nn.Module):
    """One expert: w2(silu(w1(x)) * w3(x))."""

    def __init__(self, cfg):
        super().__init__()
        h, i = cfg.hidden_size, cfg.intermediate_size
        self.w1 = nn.Linear(h, i, bias=False)
        self.w2 = nn.Linear(i, h, bias=False)
        self.w3 = nn.Linear(h, i, bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, hidden_states):
        current_hidden_states = self.act_fn(self.w1(hidden_states)) * self.w3(hidden_states)
        return self.w2(current_hidden_states)


# The tokens each expert got, per forward and sparse layer, when a caller asks (profile_step's
# routing, which membill's meta run takes with --routing).
ROUTING = None


class MixtralSparseMoeBlock(nn.Module):
    """transformers' MixtralSparseMoeBlock.forward (4.5x): the experts hit found with nonzero on
    the one_hot mask, each one's rows by torch.where over its mask slice, index_add_ into zeros."""

    def __init__(self, cfg):
        super().__init__()
        self.num_experts = cfg.num_experts
        self.top_k = cfg.num_experts_per_tok
        self.gate = nn.Linear(cfg.hidden_size, self.num_experts, bias=False)
        self.experts = nn.ModuleList([MixtralBlockSparseTop2MLP(cfg) for _ in range(self.num_experts)])

    def forward(self, hidden_states):
        with scope("moe"):
            batch_size, sequence_length, hidden_dim = hidden_states.shape
            hidden_states = hidden_states.view(-1, hidden_dim)
            router_logits = self.gate(hidden_states)
            routing_weights = F.softmax(router_logits, dim=1, dtype=torch.float)
            routing_weights, selected_experts = torch.topk(routing_weights, self.top_k, dim=-1)
            routing_weights /= routing_weights.sum(dim=-1, keepdim=True)
            routing_weights = routing_weights.to(hidden_states.dtype)
            final_hidden_states = torch.zeros((batch_size * sequence_length, hidden_dim),
                                              dtype=hidden_states.dtype, device=hidden_states.device)
            expert_mask = F.one_hot(selected_experts, num_classes=self.num_experts).permute(2, 1, 0)
            if ROUTING is not None:
                ROUTING.append([int(c) for c in expert_mask.sum(dim=(-1, -2))])
            expert_hit = torch.greater(expert_mask.sum(dim=(-1, -2)), 0).nonzero()
            for expert_idx in expert_hit:
                expert_layer = self.experts[expert_idx]
                idx, top_x = torch.where(expert_mask[expert_idx].squeeze(0))
                current_state = hidden_states[None, top_x].reshape(-1, hidden_dim)
                current_hidden_states = expert_layer(current_state) * routing_weights[top_x, idx, None]
                final_hidden_states.index_add_(0, top_x, current_hidden_states.to(hidden_states.dtype))
            final_hidden_states = final_hidden_states.reshape(batch_size, sequence_length, hidden_dim)
        return final_hidden_states, router_logits


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg, layer_idx):
        super().__init__()
        self.self_attn = LlamaAttention(cfg, layer_idx)
        self.sparse = getattr(cfg, "model_type", "llama") == "mixtral"
        if self.sparse:  # MixtralDecoderLayer
            self.block_sparse_moe = MixtralSparseMoeBlock(cfg)
        else:
            self.mlp = LlamaMLP(cfg)
        self.input_layernorm = LlamaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_value=None,
                output_attentions=False, use_cache=False, cache_position=None,
                position_embeddings=None):
        residual = hidden_states
        with scope("norm"):
            hidden_states = self.input_layernorm(hidden_states)
        hidden_states, self_attn_weights = self.self_attn(
            hidden_states=hidden_states, position_embeddings=position_embeddings,
            attention_mask=attention_mask, past_key_value=past_key_value)
        with scope("residual"):
            hidden_states = residual + hidden_states
        residual = hidden_states
        with scope("norm"):
            hidden_states = self.post_attention_layernorm(hidden_states)
        if self.sparse:  # the router's logits live until the layer returns
            hidden_states, router_logits = self.block_sparse_moe(hidden_states)
        else:
            hidden_states = self.mlp(hidden_states)
        with scope("residual"):
            hidden_states = residual + hidden_states
        return (hidden_states,)


def causal_mask_4d(sequence_length, target_length, dtype, device, cache_position, batch_size):
    """LlamaModel._prepare_4d_causal_attention_mask_with_cache_position without a 2D mask:
    [B, 1, T, target] (an expand of one [T, target] tensor), 0 allowed, dtype min masked."""
    min_dtype = torch.finfo(dtype).min
    causal_mask = torch.full((sequence_length, target_length), fill_value=min_dtype, dtype=dtype,
                             device=device)
    if sequence_length != 1:
        causal_mask = torch.triu(causal_mask, diagonal=1)
    causal_mask *= torch.arange(target_length, device=device) > cache_position.reshape(-1, 1)
    return causal_mask[None, None, :, :].expand(batch_size, 1, -1, -1)


class LlamaModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, padding_idx=cfg.pad_token_id)
        self.layers = nn.ModuleList([LlamaDecoderLayer(cfg, i)
                                     for i in range(cfg.num_hidden_layers)])
        self.norm = LlamaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(cfg)
        self.gradient_checkpointing = False

    def forward(self, input_ids, use_cache=True):
        checkpointing = self.gradient_checkpointing and self.training
        if checkpointing:
            use_cache = False  # transformers warns that use_cache=True is incompatible
        with scope("embed"):
            inputs_embeds = self.embed_tokens(input_ids)
        past_key_values = DynamicCache() if use_cache else None
        with scope("mask"):
            past_seen_tokens = past_key_values.get_seq_length() if past_key_values else 0
            cache_position = torch.arange(past_seen_tokens,
                                          past_seen_tokens + inputs_embeds.shape[1])
            position_ids = cache_position.unsqueeze(0)
            # attention_mask None: target length past + T + 1, as transformers does
            causal_mask = causal_mask_4d(inputs_embeds.shape[1],
                                         past_seen_tokens + inputs_embeds.shape[1] + 1,
                                         inputs_embeds.dtype, inputs_embeds.device,
                                         cache_position, inputs_embeds.shape[0])
        hidden_states = inputs_embeds
        with scope("rope.cos_sin"):
            position_embeddings = self.rotary_emb(hidden_states, position_ids)
        for decoder_layer in self.layers:
            if checkpointing:
                layer_outputs = torch.utils.checkpoint.checkpoint(
                    decoder_layer.__call__, hidden_states, causal_mask, position_ids,
                    past_key_values, False, use_cache, cache_position, position_embeddings,
                    use_reentrant=True)
            else:
                layer_outputs = decoder_layer(hidden_states, attention_mask=causal_mask,
                                              past_key_value=past_key_values,
                                              position_embeddings=position_embeddings)
            hidden_states = layer_outputs[0]
        with scope("final_norm"):
            hidden_states = self.norm(hidden_states)
        return hidden_states, past_key_values


def for_causal_lm_loss(logits, labels, vocab_size, ignore_index=-100):
    """transformers.loss.loss_utils.ForCausalLMLoss (num_items_in_batch None: mean)."""
    logits = logits.float()
    labels = labels.to(logits.device)
    labels = F.pad(labels, (0, 1), value=ignore_index)
    shift_labels = labels[..., 1:].contiguous()
    logits = logits.view(-1, vocab_size)
    shift_labels = shift_labels.view(-1)
    shift_labels = shift_labels.to(logits.device)
    return F.cross_entropy(logits, shift_labels, ignore_index=ignore_index, reduction="mean")


class CausalLMOutput:
    """CausalLMOutputWithPast: holds loss, logits and past_key_values while it lives."""

    def __init__(self, loss, logits, past_key_values):
        self.loss = loss
        self.logits = logits
        self.past_key_values = past_key_values


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.model = LlamaModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids, labels=None, use_cache=True, logits_to_keep=0):
        hidden_states, past_key_values = self.model(input_ids, use_cache=use_cache)
        with scope("logits"):
            slice_indices = slice(-logits_to_keep, None)
            logits = self.lm_head(hidden_states[:, slice_indices, :])
        loss = None
        if labels is not None:
            with scope("loss"):
                loss = for_causal_lm_loss(logits, labels, self.cfg.vocab_size)
        return CausalLMOutput(loss, logits, past_key_values)


def init_weights(model, seed, std=0.02):
    """transformers' _init_weights: Linear and Embedding weights ~ N(0, std), RMSNorm weights 1;
    drawn in named_parameters() order from one seeded generator (a tied weight once)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                p.copy_(torch.randn(p.shape, generator=g) * std)
    return model


def load_params(model, params):
    """Copy llama_ref-style {HF name: tensor} into the model (same names)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(params[name])
    return model
