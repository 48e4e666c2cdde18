"""Pure-PyTorch reference of Hugging Face LlamaForCausalLM semantics (and of the Mistral, Qwen2
and Qwen3 variants of it: q/k/v biases, per-head q/k RMSNorm, sliding windows; RoPE scaling as
transformers' modeling_rope_utils computes it; the mixtures of experts of Mixtral, Qwen2MoE and
Qwen3MoE as their sparse blocks compute them, with the load-balancing loss).

Self-contained (torch only): the model is a dict of leaf tensors under HF names and a set of
functions over it, so that the same code serves training (autograd, torch.optim), float64
gradcheck, and greedy generation with or without a KV cache, padded batches included.
Also holds a small safetensors reader and writer (F32, F16, BF16, I64).
"""
import json
import math
import os
import struct
import sys
from collections import OrderedDict

import torch
import torch.nn.functional as F

# ---------------------------------------------------------------------------------------------
# Config

MOE_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe")


class LlamaConfig:
    """The HF config.json fields the model needs; head_dim defaults to hidden / heads (Qwen3:
    128). model_type decides, as transformers' classes do: llama (attention_bias: q, k, v and o
    biases; mlp_bias), mistral (sliding_window on every layer, 4096 unless given), qwen2 (q, k, v
    biases; a window from layer max_window_layers on when use_sliding_window), qwen3 (q_norm and
    k_norm, attention_bias, windows as qwen2)."""

    FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "vocab_size", "max_position_embeddings", "rope_theta",
              "rms_norm_eps", "tie_word_embeddings")

    def __init__(self, d):
        missing = [k for k in self.FIELDS if k not in d and k != "num_key_value_heads"]
        if missing:
            raise ValueError("config: missing field(s) %s" % ", ".join(missing))
        self.hidden_size = int(d["hidden_size"])
        self.intermediate_size = int(d["intermediate_size"])
        self.num_hidden_layers = int(d["num_hidden_layers"])
        self.num_attention_heads = int(d["num_attention_heads"])
        self.num_key_value_heads = int(d.get("num_key_value_heads") or self.num_attention_heads)
        self.model_type = d.get("model_type", "llama")
        if self.model_type not in ("llama", "mistral", "qwen2", "qwen3") + MOE_TYPES:
            raise ValueError("config: model_type %r" % self.model_type)
        qwen3 = self.model_type in ("qwen3", "qwen3_moe")
        hd = d.get("head_dim") or (128 if self.model_type == "qwen3" else None)
        self.head_dim = int(hd) if hd else self.hidden_size // self.num_attention_heads
        family_bias = bool(d.get("attention_bias", False))
        self.attention_bias = family_bias if self.model_type in ("llama", "qwen3", "qwen3_moe") else False
        self.qkv_bias = self.attention_bias or self.model_type == "qwen2" or (
            self.model_type == "qwen2_moe" and bool(d.get("qkv_bias", True)))
        self.o_bias = self.attention_bias
        self.mlp_bias = bool(d.get("mlp_bias", False)) if self.model_type == "llama" else False
        self.qk_norm = qwen3
        self.use_sliding_window = bool(d.get("use_sliding_window", False))
        self.max_window_layers = int(d.get("max_window_layers", 28))
        self.sliding_window = d.get("sliding_window", None if self.model_type == "mixtral" else 4096)
        self._moe_fields(d)
        if self.model_type in ("mistral", "mixtral"):
            self.layer_windows = [self.sliding_window or 0] * int(d["num_hidden_layers"])
        elif self.model_type in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe") and self.use_sliding_window \
                and self.sliding_window:
            self.layer_windows = [self.sliding_window if i >= self.max_window_layers else 0
                                  for i in range(int(d["num_hidden_layers"]))]
        else:
            self.layer_windows = [0] * int(d["num_hidden_layers"])
        self.rope_scaling = d.get("rope_scaling")
        # nn.Embedding(vocab, hidden, padding_idx=pad_token_id): that row gets no gradient
        self.pad_token_id = d.get("pad_token_id")
        self.vocab_size = int(d["vocab_size"])
        self.max_position_embeddings = int(d["max_position_embeddings"])
        self.rope_theta = float(d["rope_theta"])
        self.rms_norm_eps = float(d["rms_norm_eps"])
        self.tie_word_embeddings = bool(d["tie_word_embeddings"])
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("config: num_attention_heads must be a multiple of "
                             "num_key_value_heads")

    def _moe_fields(self, d):
        """The mixture of experts of MixtralConfig, Qwen2MoeConfig and Qwen3MoeConfig (their
        defaults): which layers are sparse, the experts, top-k, the shared expert."""
        t = self.model_type
        self.num_experts = 0
        self.sparse_layers = [False] * int(d["num_hidden_layers"])
        if t not in MOE_TYPES:
            return
        defaults = {"mixtral": (8, 2, None), "qwen2_moe": (60, 4, 1408), "qwen3_moe": (128, 8, 768)}[t]
        self.num_experts = int(d.get("num_local_experts" if t == "mixtral" else "num_experts", defaults[0]))
        self.num_experts_per_tok = int(d.get("num_experts_per_tok", defaults[1]))
        self.moe_intermediate_size = int(d.get("moe_intermediate_size") or defaults[2] or 0) \
            if t != "mixtral" else self.intermediate_size
        self.norm_topk_prob = True if t == "mixtral" else bool(d.get("norm_topk_prob", False))
        self.shared_expert_intermediate_size = int(d.get("shared_expert_intermediate_size", 5632)) \
            if t == "qwen2_moe" else 0
        self.decoder_sparse_step = int(d.get("decoder_sparse_step", 1)) if t != "mixtral" else 1
        self.mlp_only_layers = list(d.get("mlp_only_layers") or []) if t != "mixtral" else []
        self.output_router_logits = bool(d.get("output_router_logits", False))
        self.router_aux_loss_coef = float(d.get("router_aux_loss_coef", 0.001))
        self.sparse_layers = [
            self.num_experts > 0 and i not in self.mlp_only_layers and (i + 1) % self.decoder_sparse_step == 0
            for i in range(int(d["num_hidden_layers"]))]

    def moe_prefix(self, layer):
        """A sparse layer's module: block_sparse_moe (Mixtral) or mlp."""
        return "model.layers.%d.%s." % (layer, "block_sparse_moe" if self.model_type == "mixtral" else "mlp")

    def expert_names(self):
        """gate, up, down of an expert: Mixtral's w1, w3, w2."""
        if self.model_type == "mixtral":
            return "w1", "w3", "w2"
        return "gate_proj", "up_proj", "down_proj"

    @classmethod
    def from_json(cls, path):
        with open(path) as f:
            return cls(json.load(f))

    def to_dict(self):
        arch = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "mixtral": "MixtralForCausalLM",
                "qwen2_moe": "Qwen2MoeForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}[self.model_type]
        d = {
            "architectures": [arch],
            "model_type": self.model_type,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": "silu",
            "attention_bias": self.attention_bias,
            "mlp_bias": self.mlp_bias,
            "torch_dtype": "float32",
        }
        if self.model_type in ("mistral", "mixtral"):
            d["sliding_window"] = self.sliding_window
        if self.model_type in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe"):
            d.update(use_sliding_window=self.use_sliding_window, sliding_window=self.sliding_window,
                     max_window_layers=self.max_window_layers)
        if self.model_type in MOE_TYPES:
            del d["mlp_bias"]
            d.update(num_experts_per_tok=self.num_experts_per_tok, output_router_logits=self.output_router_logits,
                     router_aux_loss_coef=self.router_aux_loss_coef)
            if self.model_type == "mixtral":
                d["num_local_experts"] = self.num_experts
            else:
                d.update(num_experts=self.num_experts, moe_intermediate_size=self.moe_intermediate_size,
                         norm_topk_prob=self.norm_topk_prob, decoder_sparse_step=self.decoder_sparse_step,
                         mlp_only_layers=self.mlp_only_layers)
            if self.model_type == "qwen2_moe":
                d["shared_expert_intermediate_size"] = self.shared_expert_intermediate_size
                d["qkv_bias"] = self.qkv_bias
        if self.rope_scaling is not None:
            d["rope_scaling"] = self.rope_scaling
        if self.pad_token_id is not None:
            d["pad_token_id"] = self.pad_token_id
        return d


# ---------------------------------------------------------------------------------------------
# Parameters


def param_shapes(cfg):
    """HF parameter names and shapes in HF order; lm_head.weight only when untied."""
    h, i, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    nq, nkv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    shapes = OrderedDict()
    shapes["model.embed_tokens.weight"] = (cfg.vocab_size, h)
    for layer in range(cfg.num_hidden_layers):
        p = "model.layers.%d." % layer
        shapes[p + "self_attn.q_proj.weight"] = (nq, h)
        shapes[p + "self_attn.k_proj.weight"] = (nkv, h)
        shapes[p + "self_attn.v_proj.weight"] = (nkv, h)
        shapes[p + "self_attn.o_proj.weight"] = (h, nq)
        if cfg.qkv_bias:
            shapes[p + "self_attn.q_proj.bias"] = (nq,)
            shapes[p + "self_attn.k_proj.bias"] = (nkv,)
            shapes[p + "self_attn.v_proj.bias"] = (nkv,)
        if cfg.o_bias:
            shapes[p + "self_attn.o_proj.bias"] = (h,)
        if cfg.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = (hd,)
            shapes[p + "self_attn.k_norm.weight"] = (hd,)
        if cfg.sparse_layers[layer]:
            shapes.update(moe_shapes(cfg, layer))
        else:
            shapes[p + "mlp.gate_proj.weight"] = (i, h)
            shapes[p + "mlp.up_proj.weight"] = (i, h)
            shapes[p + "mlp.down_proj.weight"] = (h, i)
        if cfg.mlp_bias:
            shapes[p + "mlp.gate_proj.bias"] = (i,)
            shapes[p + "mlp.up_proj.bias"] = (i,)
            shapes[p + "mlp.down_proj.bias"] = (h,)
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
    shapes["model.norm.weight"] = (h,)
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, h)
    return shapes


def moe_shapes(cfg, layer):
    """A sparse layer's router, routed experts and shared expert, by their checkpoint names."""
    h, mi, si = cfg.hidden_size, cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size
    pre, (g, u, d) = cfg.moe_prefix(layer), cfg.expert_names()
    shapes = OrderedDict()
    shapes[pre + "gate.weight"] = (cfg.num_experts, h)
    for e in range(cfg.num_experts):
        shapes[pre + "experts.%d.%s.weight" % (e, g)] = (mi, h)
        shapes[pre + "experts.%d.%s.weight" % (e, u)] = (mi, h)
        shapes[pre + "experts.%d.%s.weight" % (e, d)] = (h, mi)
    if si:
        shapes[pre + "shared_expert.gate_proj.weight"] = (si, h)
        shapes[pre + "shared_expert.up_proj.weight"] = (si, h)
        shapes[pre + "shared_expert.down_proj.weight"] = (h, si)
        shapes[pre + "shared_expert_gate.weight"] = (1, h)
    return shapes


def is_norm(name):
    return (name.endswith("layernorm.weight") or name == "model.norm.weight"
            or name.endswith("q_norm.weight") or name.endswith("k_norm.weight"))


def init_params(cfg, seed, std=0.02, norm_noise=0.0, dtype=torch.float32):
    """Matrices and biases ~ N(0, std); norm weights 1 (+ N(0, norm_noise) when asked). (Biases
    are not zero, as transformers' init makes them, so that a dropped bias shows.)

    Drawn in a fixed order from one seeded generator, so the result depends only on the seed.
    """
    g = torch.Generator().manual_seed(seed)
    params = OrderedDict()
    for name, shape in param_shapes(cfg).items():
        if is_norm(name):
            t = torch.ones(shape, dtype=torch.float32)
            if norm_noise:
                t += torch.randn(shape, generator=g) * norm_noise
        else:
            t = torch.randn(shape, generator=g) * std
        params[name] = t.to(dtype).requires_grad_(True)
    return params


def check_params(cfg, params):
    """Every expected tensor present with its shape, nothing unexpected (lm_head optional
    when tied, as HF checkpoints of tied models may or may not carry it)."""
    shapes = param_shapes(cfg)
    for name, shape in shapes.items():
        if name not in params:
            raise ValueError("weights: missing tensor %s" % name)
        if tuple(params[name].shape) != shape:
            raise ValueError("weights: tensor %s has shape %s, expected %s"
                             % (name, tuple(params[name].shape), shape))
    for name in params:
        if name not in shapes and not (name == "lm_head.weight" and cfg.tie_word_embeddings):
            raise ValueError("weights: unexpected tensor %s" % name)


def lm_head_weight(cfg, params):
    if cfg.tie_word_embeddings:
        return params["model.embed_tokens.weight"]
    return params["lm_head.weight"]


# ---------------------------------------------------------------------------------------------
# Ops (module-level functions, so a test can swap one for a broken variant)


def rms_norm(x, weight, eps):
    """HF LlamaRMSNorm: computed in float32 (or wider), weight applied after the cast back."""
    dt = x.dtype
    xf = x.float() if dt in (torch.float16, torch.bfloat16) else x
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(dt)


def rope_default(cfg):
    """HF default rope: 1 / theta^(arange(0, hd, 2) / hd), in float32."""
    hd = cfg.head_dim
    return 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))


def rope_inv_freq(cfg):
    """(inv_freq, attention_factor) as transformers' modeling_rope_utils computes them for the
    config's rope_scaling ("rope_type", or "type" in older configs)."""
    rs = cfg.rope_scaling or {}
    kind = rs.get("rope_type", rs.get("type", "default"))
    inv = rope_default(cfg)
    if kind == "default":
        return inv, 1.0
    factor = rs["factor"]
    if kind == "linear":
        return inv / factor, 1.0
    if kind == "dynamic":
        # at init (and for any length up to max_position_embeddings) seq_len is the maximum
        seq_len, mx, dim = cfg.max_position_embeddings, cfg.max_position_embeddings, cfg.head_dim
        base = cfg.rope_theta * ((factor * seq_len / mx) - (factor - 1)) ** (dim / (dim - 2))
        return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)), 1.0
    if kind == "llama3":
        return rope_llama3(inv, rs), 1.0
    if kind == "yarn":
        return rope_yarn(cfg, rs)
    raise ValueError("rope_scaling: type %r" % kind)


def rope_llama3(inv_freq, rs):
    factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    old = rs["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / low, old / high
    wavelen = 2 * math.pi / inv_freq
    inv_llama = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * inv_llama / factor + smooth * inv_llama
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, inv_llama)


def rope_yarn(cfg, rs):
    base, dim = cfg.rope_theta, cfg.head_dim
    factor = rs["factor"]
    attention_factor = rs.get("attention_factor")
    mscale, mscale_all_dim = rs.get("mscale"), rs.get("mscale_all_dim")
    if "original_max_position_embeddings" in rs:
        orig = rs["original_max_position_embeddings"]
        factor = cfg.max_position_embeddings / orig
    else:
        orig = cfg.max_position_embeddings

    def get_mscale(scale, m=1):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = float(get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim))
        else:
            attention_factor = get_mscale(factor)
    beta_fast, beta_slow = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1

    def correction_dim(rot):
        return (dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if rs.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation = 1 - ramp
    inv = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv, attention_factor


def rope_cos_sin(cfg, position_ids, dtype):
    """cos, sin of shape [B, T, hd] for integer positions [B, T] (emb = cat(freqs, freqs)),
    times the attention factor (yarn's; 1 otherwise), as the rotary embedding returns them."""
    inv, scale = rope_inv_freq(cfg)
    freqs = position_ids[:, :, None].float() * inv[None, None, :]  # [B, T, hd/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x, cos, sin):
    """x: [B, H, T, hd]; cos, sin: [B, T, hd]."""
    cos, sin = cos[:, None], sin[:, None]
    return x * cos + rotate_half(x) * sin


def repeat_kv(x, n_rep):
    """[B, KV, T, hd] -> [B, KV * n_rep, T, hd]; query head h uses kv head h // n_rep."""
    if n_rep == 1:
        return x
    b, kv, t, hd = x.shape
    return x[:, :, None].expand(b, kv, n_rep, t, hd).reshape(b, kv * n_rep, t, hd)


def attention_mask_4d(attention_mask, q_len, kv_len, window=0):
    """Boolean [B, 1, q_len, kv_len], True where attention is allowed.

    Queries are the last q_len positions of the kv_len-long sequence (causal); a 0 in the 2D
    mask [B, kv_len] hides that key position from every query; a sliding window hides the keys
    `window` or more slots back (transformers: kv_idx > q_idx - sliding_window).
    """
    q_pos = torch.arange(kv_len - q_len, kv_len)[:, None]
    k_pos = torch.arange(kv_len)[None, :]
    allowed = k_pos <= q_pos
    if window:
        allowed = allowed & (k_pos > q_pos - window)
    allowed = allowed[None, None]
    if attention_mask is not None:
        allowed = allowed & attention_mask[:, None, None, :].bool()
    return allowed


def attention(q, k, v, allowed):
    """Eager attention. q: [B, H, T, hd], k, v: [B, H, S, hd], allowed: [B|1, 1, T, S].

    Softmax runs in float32 for half inputs (as HF), in the input's dtype otherwise.
    Masked scores are set to the dtype's min (as HF adds it), so a fully masked row (a left pad
    query) stays finite instead of NaN; its output is never used.
    """
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = torch.matmul(q, k.transpose(2, 3)) * scale
    scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    wide = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    probs = F.softmax(scores, dim=-1, dtype=wide).to(q.dtype)
    return torch.matmul(probs, v)


def swiglu_mlp(x, gate_w, up_w, down_w, gate_b=None, up_b=None, down_b=None):
    return F.linear(F.silu(F.linear(x, gate_w, gate_b)) * F.linear(x, up_w, up_b), down_w, down_b)


# Every router's softmax of the last forward, kept when a caller asks (make_golden's margins).
ROUTER_PROBS = []
KEEP_ROUTER_PROBS = False


def sparse_moe(cfg, params, layer, x, router_logits):
    """MixtralSparseMoeBlock / Qwen2MoeSparseMoeBlock / Qwen3MoeSparseMoeBlock.forward on normed
    x [B, T, h]: softmax in float32, top-k, renormalised (Mixtral always, Qwen when
    norm_topk_prob), each expert's SwiGLU over its tokens, scaled by their weights and index_add_
    into zeros; the shared expert gated by a sigmoid (Qwen2MoE). router_logits (a list, or None)
    gets the router's logits."""
    b, t, h = x.shape
    pre, (gn, un, dn) = cfg.moe_prefix(layer), cfg.expert_names()
    hs = x.reshape(-1, h)
    logits = F.linear(hs, params[pre + "gate.weight"])
    if router_logits is not None:
        router_logits.append(logits)
    weights = F.softmax(logits, dim=1, dtype=torch.float)
    if KEEP_ROUTER_PROBS:
        ROUTER_PROBS.append(weights.detach())
    weights, selected = torch.topk(weights, cfg.num_experts_per_tok, dim=-1)
    if cfg.norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    weights = weights.to(hs.dtype)
    out = torch.zeros_like(hs)
    mask = F.one_hot(selected, num_classes=cfg.num_experts).permute(2, 1, 0)
    for e in range(cfg.num_experts):
        idx, top_x = torch.where(mask[e])
        if top_x.numel() == 0:
            continue
        w = "%sexperts.%d." % (pre, e)
        y = swiglu_mlp(hs[top_x], params[w + gn + ".weight"], params[w + un + ".weight"], params[w + dn + ".weight"])
        out = out.index_add(0, top_x, y * weights[top_x, idx, None])
    if cfg.shared_expert_intermediate_size:
        s = pre + "shared_expert."
        shared = swiglu_mlp(hs, params[s + "gate_proj.weight"], params[s + "up_proj.weight"],
                            params[s + "down_proj.weight"])
        out = out + torch.sigmoid(F.linear(hs, params[pre + "shared_expert_gate.weight"])) * shared
    return out.reshape(b, t, h)


def load_balancing_loss(cfg, router_logits):
    """load_balancing_loss_func without an attention mask: E Σ_e f_e mean(p_e) over every sparse
    layer's tokens, f_e the share of the top-k choices that went to expert e."""
    cat = torch.cat(router_logits, dim=0)
    probs = F.softmax(cat, dim=-1)
    _, selected = torch.topk(probs, cfg.num_experts_per_tok, dim=-1)
    mask = F.one_hot(selected, cfg.num_experts)
    tokens_per_expert = torch.mean(mask.float(), dim=0)
    prob_per_expert = torch.mean(probs, dim=0)
    return torch.sum(tokens_per_expert * prob_per_expert.unsqueeze(0)) * cfg.num_experts


# ---------------------------------------------------------------------------------------------
# Model


def attention_block(cfg, params, prefix, x, cos, sin, allowed, cache_kv):
    """One self_attn block on normed x [B, T, h]. cache_kv: None or a [k, v] list that is
    extended in place with this call's (post-RoPE) keys and values [B, KV, S, hd]."""
    b, t, _ = x.shape
    nh, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    bias = params.get
    q = F.linear(x, params[prefix + "q_proj.weight"], bias(prefix + "q_proj.bias")).view(b, t, nh, hd)
    k = F.linear(x, params[prefix + "k_proj.weight"], bias(prefix + "k_proj.bias")).view(b, t, nkv, hd)
    v = F.linear(x, params[prefix + "v_proj.weight"], bias(prefix + "v_proj.bias")).view(b, t, nkv, hd)
    if cfg.qk_norm:  # Qwen3Attention: q_norm(q_proj(x).view(...)), before the transpose and RoPE
        q = rms_norm(q, params[prefix + "q_norm.weight"], cfg.rms_norm_eps)
        k = rms_norm(k, params[prefix + "k_norm.weight"], cfg.rms_norm_eps)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    q = apply_rope(q, cos, sin)
    k = apply_rope(k, cos, sin)
    if cache_kv is not None:
        if cache_kv[0] is not None:
            k = torch.cat((cache_kv[0], k), dim=2)
            v = torch.cat((cache_kv[1], v), dim=2)
        cache_kv[0], cache_kv[1] = k, v
    n_rep = nh // nkv
    out = attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), allowed)
    out = out.transpose(1, 2).reshape(b, t, nh * hd)
    return F.linear(out, params[prefix + "o_proj.weight"], bias(prefix + "o_proj.bias"))


def new_cache(cfg):
    """KV cache: per layer [k, v], each [B, KV, S, hd] after the first call (None before)."""
    return [[None, None] for _ in range(cfg.num_hidden_layers)]


def cache_len(cache):
    return 0 if cache is None or cache[0][0] is None else cache[0][0].shape[2]


def forward(cfg, params, input_ids, attention_mask=None, position_ids=None, cache=None, router_logits=None):
    """Logits [B, T, V] for input_ids [B, T].

    attention_mask: [B, S] of 0/1 over past + current tokens (S = cached + T), or None.
    position_ids: [B, T]; default cached + arange(T).
    cache: from new_cache(); extended in place.
    """
    b, t = input_ids.shape
    past = cache_len(cache)
    if position_ids is None:
        position_ids = torch.arange(past, past + t)[None].expand(b, t)
    dtype = params["model.embed_tokens.weight"].dtype
    x = F.embedding(input_ids, params["model.embed_tokens.weight"], padding_idx=cfg.pad_token_id)
    cos, sin = rope_cos_sin(cfg, position_ids, dtype)
    eps = cfg.rms_norm_eps
    for layer in range(cfg.num_hidden_layers):
        p = "model.layers.%d." % layer
        allowed = attention_mask_4d(attention_mask, t, past + t, cfg.layer_windows[layer])
        hn = rms_norm(x, params[p + "input_layernorm.weight"], eps)
        x = x + attention_block(cfg, params, p + "self_attn.", hn, cos, sin, allowed,
                                cache[layer] if cache is not None else None)
        hn = rms_norm(x, params[p + "post_attention_layernorm.weight"], eps)
        if cfg.sparse_layers[layer]:
            x = x + sparse_moe(cfg, params, layer, hn, router_logits)
            continue
        m = p + "mlp."
        x = x + swiglu_mlp(hn, params[m + "gate_proj.weight"], params[m + "up_proj.weight"],
                           params[m + "down_proj.weight"], params.get(m + "gate_proj.bias"),
                           params.get(m + "up_proj.bias"), params.get(m + "down_proj.bias"))
    x = rms_norm(x, params["model.norm.weight"], eps)
    return F.linear(x, lm_head_weight(cfg, params))


def causal_lm_loss(logits, input_ids):
    """HF labels=input_ids: predict token t+1 from position t, mean over B * (T - 1)."""
    v = logits.shape[-1]
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()  # HF upcasts half logits; float64 stays float64 (gradcheck)
    return F.cross_entropy(logits[:, :-1].reshape(-1, v), input_ids[:, 1:].reshape(-1))


def loss_fn(cfg, params, input_ids):
    """The causal LM loss; with output_router_logits, + router_aux_loss_coef x the load-balancing
    loss (MixtralForCausalLM.forward)."""
    aux = getattr(cfg, "output_router_logits", False) and any(cfg.sparse_layers)
    router_logits = [] if aux else None
    loss = causal_lm_loss(forward(cfg, params, input_ids, router_logits=router_logits), input_ids)
    if aux:
        loss = loss + cfg.router_aux_loss_coef * load_balancing_loss(cfg, router_logits)
    return loss


# ---------------------------------------------------------------------------------------------
# Greedy generation (HF generate(do_sample=False) semantics)


def padded_positions(attention_mask):
    """HF: position_ids = cumsum(mask) - 1, with pad positions set to 1 (they are masked)."""
    pos = attention_mask.long().cumsum(-1) - 1
    return pos.masked_fill(attention_mask == 0, 1)


@torch.no_grad()
def greedy_uncached(logits_of, prompt, n):
    """generate(do_sample=False) of n tokens, each from logits_of(the whole sequence so far) [B, t,
    V] (the uncached path: a cache's own answer must equal it); the tokens [B, n] and the least
    margin between the best and the second logit."""
    seq, margin = prompt, float("inf")
    with torch.no_grad():
        for _ in range(n):
            last = logits_of(seq)[:, -1]
            top = last.topk(2, dim=-1).values
            margin = min(margin, (top[:, 0] - top[:, 1]).min().item())
            seq = torch.cat([seq, last.argmax(dim=-1, keepdim=True)], dim=1)
    return seq[:, prompt.shape[1]:], margin


def greedy_generate(cfg, params, prompt, n_new, attention_mask=None, use_cache=True,
                    return_margins=False):
    """New token ids [B, n_new] after prompt [B, T] (left padded when a mask is given).

    use_cache: prefill then one token per step with the KV cache; otherwise the whole
    sequence is recomputed at every step. return_margins also gives, per step and row, the
    gap between the best and the second best logit (how safe the argmax is).
    """
    b = prompt.shape[0]
    mask = attention_mask if attention_mask is not None else torch.ones_like(prompt)
    seq, out, margins = prompt, [], []
    cache = new_cache(cfg) if use_cache else None
    step_ids, step_pos = prompt, padded_positions(mask)
    for _ in range(n_new):
        if use_cache:
            logits = forward(cfg, params, step_ids, mask, step_pos, cache)
        else:
            logits = forward(cfg, params, seq, mask, padded_positions(mask), None)
        last = logits[:, -1].float()
        nxt = last.argmax(-1)
        top2 = last.topk(2, dim=-1).values
        margins.append(top2[:, 0] - top2[:, 1])
        out.append(nxt)
        seq = torch.cat((seq, nxt[:, None]), dim=1)
        step_pos = padded_positions(mask)[:, -1:] + 1
        mask = torch.cat((mask, torch.ones(b, 1, dtype=mask.dtype)), dim=1)
        step_ids = nxt[:, None]
    tokens = torch.stack(out, dim=1)
    if return_margins:
        return tokens, torch.stack(margins, dim=1)
    return tokens


def left_pad(prompts, pad_id=0):
    """List of 1D id tensors -> (ids [B, Tmax], mask [B, Tmax]) padded on the left."""
    tmax = max(int(p.numel()) for p in prompts)
    ids = torch.full((len(prompts), tmax), pad_id, dtype=torch.int64)
    mask = torch.zeros((len(prompts), tmax), dtype=torch.int64)
    for r, p in enumerate(prompts):
        n = int(p.numel())
        ids[r, tmax - n:] = p
        mask[r, tmax - n:] = 1
    return ids, mask


# ---------------------------------------------------------------------------------------------
# safetensors (format: u64 LE header length, JSON header, raw little-endian data)

if sys.byteorder != "little":
    raise ImportError("llama_ref: safetensors helpers assume a little-endian host")

_ST_DTYPES = {"F32": (torch.float32, 4), "F16": (torch.float16, 2),
              "BF16": (torch.bfloat16, 2), "I64": (torch.int64, 8)}
_ST_NAMES = {v[0]: k for k, v in _ST_DTYPES.items()}
# Raw bytes move through numpy, which has no bfloat16: reinterpret 2-byte types as int16.
_ST_CARRIER = {torch.float32: torch.float32, torch.float16: torch.int16,
               torch.bfloat16: torch.int16, torch.int64: torch.int64}


def _tensor_bytes(t):
    t = t.detach().contiguous().cpu()
    return t.view(_ST_CARRIER[t.dtype]).numpy().tobytes()


def st_write(path, tensors, metadata=None):
    """Write {name: tensor} (F32, F16, BF16, I64), names sorted, header padded to 8 bytes."""
    header, blobs, offset = OrderedDict(), [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name in sorted(tensors):
        t = tensors[name]
        if t.dtype not in _ST_NAMES:
            raise ValueError("safetensors: %s has unsupported dtype %s" % (name, t.dtype))
        data = _tensor_bytes(t)
        header[name] = {"dtype": _ST_NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * (-len(hjson) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for data in blobs:
            f.write(data)


def st_read(path, with_metadata=False):
    """Read a safetensors file into {name: tensor}; checks offsets and sizes."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError("%s: too short for a safetensors header" % path)
    (hlen,) = struct.unpack("<Q", raw[:8])
    if 8 + hlen > len(raw):
        raise ValueError("%s: header length %d past end of file" % (path, hlen))
    header = json.loads(raw[8:8 + hlen].decode("utf-8"))
    data = raw[8 + hlen:]
    metadata = header.pop("__metadata__", {})
    out = OrderedDict()
    for name, info in header.items():
        if info["dtype"] not in _ST_DTYPES:
            raise ValueError("%s: tensor %s has unsupported dtype %s"
                             % (path, name, info["dtype"]))
        dtype, size = _ST_DTYPES[info["dtype"]]
        shape = [int(s) for s in info["shape"]]
        begin, end = info["data_offsets"]
        if end - begin != math.prod(shape) * size or end > len(data) or begin < 0:
            raise ValueError("%s: tensor %s has bad data_offsets %s for shape %s %s"
                             % (path, name, info["data_offsets"], shape, info["dtype"]))
        carrier = _ST_CARRIER[dtype]
        t = torch.frombuffer(bytearray(data[begin:end]), dtype=carrier) if end > begin \
            else torch.empty(0, dtype=carrier)
        out[name] = t.view(dtype).reshape(shape).clone()
    return (out, metadata) if with_metadata else out


def load_model(folder_or_file, config_path=None, dtype=torch.float32):
    """(cfg, params) from an HF folder (config.json + model.safetensors) or a file + config.
    Weights of any stored dtype are converted to `dtype`; a tied lm_head.weight is dropped."""
    if os.path.isdir(folder_or_file):
        config_path = config_path or os.path.join(folder_or_file, "config.json")
        folder_or_file = os.path.join(folder_or_file, "model.safetensors")
    cfg = LlamaConfig.from_json(config_path)
    raw = st_read(folder_or_file)
    check_params(cfg, raw)
    params = OrderedDict()
    for name in param_shapes(cfg):
        params[name] = raw[name].to(dtype).requires_grad_(True)
    return cfg, params
