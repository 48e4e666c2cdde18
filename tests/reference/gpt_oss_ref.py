"""Pure-PyTorch reference of transformers' GptOssForCausalLM (modeling_gpt_oss.py) in training
mode, and the golden files of tests/golden/tiny_gpt_oss:

    /usr/bin/python3 tests/reference/gpt_oss_ref.py [--out tests/golden]

What it computes beyond a Llama block: q, k, v and o_proj biases; eager attention with sinks (one
learned logit per head concatenated to each row's scores, the row max subtracted, the softmax
taken, the sink's column dropped); a sliding window on the layers layer_types says
("sliding_attention": keys j with j > i - sliding_window); the router F.linear with a bias, topk
of its logits, softmax over the k; GptOssExperts' training loop over the experts hit (the stacked
gate_up_proj [E, H, 2I] with gate and up interleaved, the clamped SwiGLU (up + 1) * gate *
sigmoid(gate * 1.702), down_proj [E, I, H], the biases); YaRN through llama_ref's rope.

Deterministic (fixed seeds, CPU float32, one thread): the files are byte-identical run to run.
Writes config.json, model.safetensors and golden.safetensors (input_ids, loss, grad.<name>, and
greedy: the 8 tokens generate(do_sample=False) gives after the first prompt).
"""
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref as L  # noqa: E402

ALPHA = 1.702  # GptOssExperts.alpha

CONFIG = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 64,
    "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "vocab_size": 256, "max_position_embeddings": 128, "rope_theta": 150000.0,
    "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                     "original_max_position_embeddings": 32, "truncate": False},
    "rms_norm_eps": 1e-05, "tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": True,
    "torch_dtype": "float32", "sliding_window": 4, "layer_types": ["sliding_attention", "full_attention"],
    "num_local_experts": 4, "num_experts_per_tok": 2, "swiglu_limit": 1.5, "output_router_logits": False,
    "router_aux_loss_coef": 0.9,
}
SEED = 1015
MIN_ROUTE_GAP = 1e-4  # the k-th and (k+1)-th router logits of every token lie this far apart
N_NEW = 8  # greedy tokens after ids[0]
MIN_MARGIN = 1e-3  # every greedy argmax wins by this much, so float noise cannot flip it
META = {"format": "pt", "generator": "tests/reference/gpt_oss_ref.py"}


class Config:
    """The fields of GptOssConfig the model reads (llama_ref's rope reads the same names)."""

    def __init__(self, d):
        for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings", "rope_theta",
                  "rms_norm_eps", "sliding_window", "num_local_experts", "num_experts_per_tok", "swiglu_limit"):
            setattr(self, k, d[k])
        self.rope_scaling = d.get("rope_scaling")
        self.layer_types = d["layer_types"]


def param_shapes(cfg):
    """Hugging Face's names and shapes, as GptOssForCausalLM registers them."""
    h, q, kv = cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    e, i = cfg.num_local_experts, cfg.intermediate_size
    shapes = {"model.embed_tokens.weight": (cfg.vocab_size, h)}
    for layer in range(cfg.num_hidden_layers):
        p = "model.layers.%d." % layer
        shapes.update({
            p + "input_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h), p + "self_attn.q_proj.bias": (q,),
            p + "self_attn.k_proj.weight": (kv, h), p + "self_attn.k_proj.bias": (kv,),
            p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.v_proj.bias": (kv,),
            p + "self_attn.o_proj.weight": (h, q), p + "self_attn.o_proj.bias": (h,),
            p + "self_attn.sinks": (cfg.num_attention_heads,),
            p + "post_attention_layernorm.weight": (h,),
            p + "mlp.router.weight": (e, h), p + "mlp.router.bias": (e,),
            p + "mlp.experts.gate_up_proj": (e, h, 2 * i), p + "mlp.experts.gate_up_proj_bias": (e, 2 * i),
            p + "mlp.experts.down_proj": (e, i, h), p + "mlp.experts.down_proj_bias": (e, h),
        })
    shapes["model.norm.weight"] = (h,)
    shapes["lm_head.weight"] = (cfg.vocab_size, h)
    return shapes


def init_params(cfg, seed):
    """N(0, 0.1) weights, biases and sinks (so that their gradients matter), norms 1 + N(0, 0.1)."""
    g = torch.Generator().manual_seed(seed)
    params = {}
    for name, shape in param_shapes(cfg).items():
        t = torch.randn(shape, generator=g) * 0.1
        if name.endswith("layernorm.weight") or name == "model.norm.weight":
            t = t + 1.0
        if name.endswith("sinks"):
            t = t * 10.0  # a sink of the size of a row's scores
        params[name] = t
    return params


def attention(cfg, params, p, x, cos, sin, window):
    """GptOssAttention with eager_attention_forward: biases, RoPE, sinks, the window."""
    b, t, _ = x.shape
    hd, nh, nkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads

    def proj(n, heads):
        y = F.linear(x, params[p + n + ".weight"], params[p + n + ".bias"])
        return y.view(b, t, heads, hd).transpose(1, 2)

    q, k, v = proj("q_proj", nh), proj("k_proj", nkv), proj("v_proj", nkv)
    q, k = L.apply_rope(q, cos, sin), L.apply_rope(k, cos, sin)
    k, v = L.repeat_kv(k, nh // nkv), L.repeat_kv(v, nh // nkv)
    scores = torch.matmul(q, k.transpose(2, 3)) * hd ** -0.5
    allowed = L.attention_mask_4d(None, t, t, window)
    scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    sinks = params[p + "sinks"].reshape(1, -1, 1, 1).expand(b, -1, t, -1)
    combined = torch.cat([scores, sinks], dim=-1)
    combined = combined - combined.max(dim=-1, keepdim=True).values
    probs = F.softmax(combined, dim=-1, dtype=combined.dtype)[..., :-1]
    out = torch.matmul(probs, v).transpose(1, 2).reshape(b, t, nh * hd)
    return F.linear(out, params[p + "o_proj.weight"], params[p + "o_proj.bias"])


def router(cfg, params, p, x, logits_out=None):
    """GptOssTopKRouter: scores [N, E] (the top-k's softmax scattered) and the indices [N, k]."""
    logits = F.linear(x, params[p + "router.weight"], params[p + "router.bias"])
    if logits_out is not None:
        logits_out.append(logits.detach())
    top, idx = torch.topk(logits, cfg.num_experts_per_tok, dim=-1)
    top = F.softmax(top, dim=1, dtype=top.dtype)
    return torch.zeros_like(logits).scatter_(1, idx, top), idx


def experts(cfg, params, p, x, scores, idx, clamped):
    """GptOssExperts.forward in training mode: a loop over the experts hit."""
    gu_w, gu_b = params[p + "experts.gate_up_proj"], params[p + "experts.gate_up_proj_bias"]
    d_w, d_b = params[p + "experts.down_proj"], params[p + "experts.down_proj_bias"]
    limit = cfg.swiglu_limit
    out = torch.zeros_like(x)
    mask = F.one_hot(idx, num_classes=cfg.num_local_experts).permute(2, 1, 0)  # [E, k, N]
    for e in torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()[:, 0].tolist():
        _, tok = torch.where(mask[e])
        gate_up = x[tok] @ gu_w[e] + gu_b[e]
        gate, up = gate_up[..., ::2], gate_up[..., 1::2]
        clamped[0] += int((gate > limit).sum() + (up.abs() > limit).sum())
        gate = gate.clamp(min=None, max=limit)
        up = up.clamp(min=-limit, max=limit)
        glu = gate * torch.sigmoid(gate * ALPHA)
        y = ((up + 1) * glu) @ d_w[e] + d_b[e]
        out.index_add_(0, tok, y * scores[tok, e, None])
    return out


def forward(cfg, params, ids, logits_out=None, clamped=None):
    """Logits [B, T, V] (every token routed, as transformers' sparse blocks route them)."""
    b, t = ids.shape
    clamped = clamped if clamped is not None else [0]
    x = F.embedding(ids, params["model.embed_tokens.weight"])
    cos, sin = L.rope_cos_sin(cfg, torch.arange(t)[None].expand(b, t), x.dtype)
    eps = cfg.rms_norm_eps
    for layer in range(cfg.num_hidden_layers):
        p = "model.layers.%d." % layer
        window = cfg.sliding_window if cfg.layer_types[layer] == "sliding_attention" else 0
        x = x + attention(cfg, params, p + "self_attn.", L.rms_norm(x, params[p + "input_layernorm.weight"], eps),
                          cos, sin, window)
        h = L.rms_norm(x, params[p + "post_attention_layernorm.weight"], eps).reshape(b * t, -1)
        scores, idx = router(cfg, params, p + "mlp.", h, logits_out)
        x = x + experts(cfg, params, p + "mlp.", h, scores, idx, clamped).view(b, t, -1)
    x = L.rms_norm(x, params["model.norm.weight"], eps)
    return F.linear(x, params["lm_head.weight"])


def loss_fn(cfg, params, ids, logits_out=None, clamped=None):
    return L.causal_lm_loss(forward(cfg, params, ids, logits_out, clamped), ids)


def greedy(cfg, params, prompt, n, logits_out):
    """generate(do_sample=False) of n tokens, each from a whole forward of the sequence so far (the
    uncached path: the cache's own answer must equal it); returns the tokens and the least margin
    between the best and the second logit."""
    seq, margin = prompt, float("inf")
    with torch.no_grad():
        for _ in range(n):
            last = forward(cfg, params, seq, logits_out)[:, -1]
            top = last.topk(2, dim=-1).values
            margin = min(margin, (top[:, 0] - top[:, 1]).min().item())
            seq = torch.cat([seq, last.argmax(dim=-1, keepdim=True)], dim=1)
    return seq[:, prompt.shape[1]:], margin


def main():
    args = L.golden_args(__doc__)
    cfg = Config(CONFIG)
    params = init_params(cfg, SEED)
    ids = torch.randint(1, cfg.vocab_size, (2, 7), generator=torch.Generator().manual_seed(SEED + 500),
                        dtype=torch.int64)
    leaves = {n: t.clone().requires_grad_(True) for n, t in params.items()}
    logits, clamped = [], [0]
    loss = loss_fn(cfg, leaves, ids, logits, clamped)
    loss.backward()
    tokens, margin = greedy(cfg, params, ids[:1], N_NEW, logits)
    if margin < MIN_MARGIN:
        raise SystemExit("gpt_oss_ref: a greedy argmax wins by %.1e only: pick another seed" % margin)
    k = cfg.num_experts_per_tok
    gap = min((z.sort(dim=-1, descending=True).values[:, k - 1] - z.sort(dim=-1, descending=True).values[:, k])
              .min().item() for z in logits)
    if gap < MIN_ROUTE_GAP:
        raise SystemExit("gpt_oss_ref: router logits %.1e apart at the top-k boundary: pick another seed" % gap)
    if clamped[0] == 0:
        raise SystemExit("gpt_oss_ref: the SwiGLU clamp is never reached: lower swiglu_limit")
    folder = L.write_model_folder(args.out, "tiny_gpt_oss", CONFIG, params, META)
    golden = dict(L.loss_golden(ids, loss, leaves), greedy=tokens)
    L.st_write(os.path.join(folder, "golden.safetensors"), golden, META)
    print("tiny_gpt_oss", json.dumps({"loss": loss.item(), "min_route_gap": gap, "clamped": clamped[0],
                                      "greedy": tokens.tolist(), "min_margin": margin}))


if __name__ == "__main__":
    main()
