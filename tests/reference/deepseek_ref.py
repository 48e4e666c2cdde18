"""Pure-PyTorch reference of transformers' DeepseekV3ForCausalLM (modeling_deepseek_v3.py) in
training mode, and the golden files of tests/golden/tiny_deepseek_v3:

    /usr/bin/python3 tests/reference/deepseek_ref.py [--out tests/golden]

What it computes beyond a Llama block: multi-head latent attention (q_a_proj, q_a_layernorm and
q_b_proj; kv_a_proj_with_mqa split into the compressed kv and one shared k_pe, kv_a_layernorm,
kv_b_proj into each head's k_nope and v; RoPE on q_pe and k_pe alone, de-interleaved first as
apply_rotary_pos_emb_interleave does; q and k the cat of both parts; the scale (nope + rope)^-1/2
times yarn's mscale squared; a value head of its own); the first first_k_dense_replace layers
dense; DeepseekV3TopkRouter (float32 logits, sigmoid scores, e_score_correction_bias added for
the choice alone, the groups by the sum of their two best choices, top-k within the chosen
groups, the unbiased scores renormalised and times routed_scaling_factor); DeepseekV3MoE's loop
over the experts and the shared experts (no gate).

Deterministic (fixed seeds, CPU float32, one thread): the files are byte-identical run to run.
Writes config.json, model.safetensors and golden.safetensors (input_ids, loss, grad.<name>, the
buffer e_score_correction_bias's gradient zeros (it has none); greedy: the 8 tokens
generate(do_sample=False) gives after the first prompt).
"""
import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref as L  # noqa: E402

CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 64,
    "intermediate_size": 96, "moe_intermediate_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4,
    "num_key_value_heads": 4, "vocab_size": 256, "max_position_embeddings": 128, "rope_theta": 10000.0,
    "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "beta_fast": 32,
                     "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
    "rms_norm_eps": 1e-06, "tie_word_embeddings": False, "hidden_act": "silu", "q_lora_rank": 24,
    "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 10, "n_routed_experts": 8,
    "num_experts_per_tok": 2, "n_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 4, "topk_group": 2,
    "routed_scaling_factor": 2.5, "norm_topk_prob": True, "rope_interleave": True, "attention_bias": False,
    "torch_dtype": "float32",
}
SEED = 3103
N_NEW = 8  # greedy tokens after ids[0]
MIN_MARGIN = 1e-3  # every greedy argmax wins by this much, so float noise cannot flip it
MIN_ROUTE_GAP = 1e-4  # the k-th and (k+1)-th choices, and the chosen groups' boundary, this far apart
META = {"format": "pt", "generator": "tests/reference/deepseek_ref.py"}
BUFFER = "mlp.gate.e_score_correction_bias"


class Config:
    """The fields of DeepseekV3Config the model reads; head_dim is qk_rope_head_dim (RoPE's)."""

    def __init__(self, d):
        for k, v in d.items():
            setattr(self, k, v)
        self.head_dim = d["qk_rope_head_dim"]
        self.qk_head_dim = d["qk_nope_head_dim"] + d["qk_rope_head_dim"]


def param_shapes(cfg):
    """Hugging Face's names and shapes, as DeepseekV3ForCausalLM registers them (and the buffer)."""
    h, nh, e = cfg.hidden_size, cfg.num_attention_heads, cfg.n_routed_experts
    shapes = {"model.embed_tokens.weight": (cfg.vocab_size, h)}
    for layer in range(cfg.num_hidden_layers):
        p = "model.layers.%d." % layer
        shapes.update({
            p + "input_layernorm.weight": (h,),
            p + "self_attn.q_a_proj.weight": (cfg.q_lora_rank, h),
            p + "self_attn.q_a_layernorm.weight": (cfg.q_lora_rank,),
            p + "self_attn.q_b_proj.weight": (nh * cfg.qk_head_dim, cfg.q_lora_rank),
            p + "self_attn.kv_a_proj_with_mqa.weight": (cfg.kv_lora_rank + cfg.qk_rope_head_dim, h),
            p + "self_attn.kv_a_layernorm.weight": (cfg.kv_lora_rank,),
            p + "self_attn.kv_b_proj.weight": (nh * (cfg.qk_nope_head_dim + cfg.v_head_dim), cfg.kv_lora_rank),
            p + "self_attn.o_proj.weight": (h, nh * cfg.v_head_dim),
            p + "post_attention_layernorm.weight": (h,),
        })
        if layer < cfg.first_k_dense_replace:
            i = cfg.intermediate_size
            shapes.update({p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h),
                           p + "mlp.down_proj.weight": (h, i)})
            continue
        i, s = cfg.moe_intermediate_size, cfg.moe_intermediate_size * cfg.n_shared_experts
        shapes.update({p + "mlp.gate.weight": (e, h), p + BUFFER: (e,)})
        for x in range(e):
            q = p + "mlp.experts.%d." % x
            shapes.update({q + "gate_proj.weight": (i, h), q + "up_proj.weight": (i, h), q + "down_proj.weight": (h, i)})
        shapes.update({p + "mlp.shared_experts.gate_proj.weight": (s, h), p + "mlp.shared_experts.up_proj.weight": (s, h),
                       p + "mlp.shared_experts.down_proj.weight": (h, s)})
    shapes["model.norm.weight"] = (h,)
    shapes["lm_head.weight"] = (cfg.vocab_size, h)
    return shapes


def init_params(cfg, seed):
    """N(0, 0.1) weights (the router's N(0, 0.3), so that its scores spread), norms 1 + N(0, 0.1),
    the correction bias N(0, 0.05) (it moves choices)."""
    g = torch.Generator().manual_seed(seed)
    params = {}
    for name, shape in param_shapes(cfg).items():
        t = torch.randn(shape, generator=g) * 0.1
        if name.endswith("layernorm.weight") or name == "model.norm.weight":
            t = t + 1.0
        if name.endswith("mlp.gate.weight"):
            t = t * 3.0
        if name.endswith(BUFFER):
            t = t * 0.5
        params[name] = t
    return params


def interleaved(x):
    """apply_rotary_pos_emb_interleave's view(.., d/2, 2).transpose(-1, -2).reshape(.., d)."""
    b, h, s, d = x.shape
    return x.view(b, h, s, d // 2, 2).transpose(4, 3).reshape(b, h, s, d)


def attention(cfg, params, p, x, cos, sin):
    """DeepseekV3Attention with eager_attention_forward (causal, no mask beyond it)."""
    b, t, _ = x.shape
    nh, nope, rope, dv = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
    eps = cfg.rms_norm_eps
    q = F.linear(L.rms_norm(F.linear(x, params[p + "q_a_proj.weight"]), params[p + "q_a_layernorm.weight"], eps),
                 params[p + "q_b_proj.weight"])
    q = q.view(b, t, nh, cfg.qk_head_dim).transpose(1, 2)
    q_pass, q_rot = torch.split(q, [nope, rope], dim=-1)
    ckv = F.linear(x, params[p + "kv_a_proj_with_mqa.weight"])
    k_pass, k_rot = torch.split(ckv, [cfg.kv_lora_rank, rope], dim=-1)
    k_pass = F.linear(L.rms_norm(k_pass, params[p + "kv_a_layernorm.weight"], eps), params[p + "kv_b_proj.weight"])
    k_pass = k_pass.view(b, t, nh, nope + dv).transpose(1, 2)
    k_pass, v = torch.split(k_pass, [nope, dv], dim=-1)
    k_rot = k_rot.view(b, 1, t, rope)
    if cfg.rope_interleave:
        q_rot, k_rot = interleaved(q_rot), interleaved(k_rot)
    q_rot, k_rot = L.apply_rope(q_rot, cos, sin), L.apply_rope(k_rot, cos, sin)
    k_rot = k_rot.expand(*k_pass.shape[:-1], -1)
    q = torch.cat((q_pass, q_rot), dim=-1)
    k = torch.cat((k_pass, k_rot), dim=-1)
    scale = cfg.qk_head_dim ** -0.5
    rs = cfg.rope_scaling
    if rs and rs.get("mscale_all_dim", 0) and rs["factor"] > 1:
        m = 0.1 * rs["mscale_all_dim"] * math.log(rs["factor"]) + 1.0
        scale = scale * m * m
    scores = torch.matmul(q, k.transpose(2, 3)) * scale
    allowed = L.attention_mask_4d(None, t, t)
    scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    probs = F.softmax(scores, dim=-1, dtype=torch.float32)
    out = torch.matmul(probs, v).transpose(1, 2).reshape(b, t, nh * dv)
    return F.linear(out, params[p + "o_proj.weight"])


def router(cfg, params, p, x, gaps):
    """DeepseekV3TopkRouter: the indices [N, k] and weights [N, k]; gaps gets each row's margins."""
    e, ng = cfg.n_routed_experts, cfg.n_group
    scores = F.linear(x.float(), params[p + "gate.weight"].float()).sigmoid()
    with torch.no_grad():
        choice = scores.view(-1, e) + params[p + "gate.e_score_correction_bias"].unsqueeze(0)
        group_scores = choice.view(-1, ng, e // ng).topk(2, dim=-1)[0].sum(dim=-1)
        gs = group_scores.sort(dim=-1, descending=True).values
        gaps.append((gs[:, cfg.topk_group - 1] - gs[:, cfg.topk_group]).min().item())
        group_idx = torch.topk(group_scores, k=cfg.topk_group, dim=-1, sorted=False)[1]
        mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
        mask = mask.unsqueeze(-1).expand(-1, ng, e // ng).reshape(-1, e)
        choice = choice.masked_fill(~mask.bool(), 0.0)
        cs = choice.sort(dim=-1, descending=True).values
        k = cfg.num_experts_per_tok
        gaps.append((cs[:, k - 1] - cs[:, k]).min().item())
        idx = torch.topk(choice, k=k, dim=-1, sorted=False)[1]
    w = scores.gather(1, idx)
    if cfg.norm_topk_prob:
        w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
    return idx, w * cfg.routed_scaling_factor


def moe(cfg, params, p, x, gaps):
    """DeepseekV3MoE: the routed experts' loop, then the shared experts on the same input."""
    idx, w = router(cfg, params, p + "mlp.", x, gaps)
    out = torch.zeros_like(x, dtype=w.dtype)
    mask = F.one_hot(idx, num_classes=cfg.n_routed_experts).permute(2, 0, 1)
    for e in range(cfg.n_routed_experts):
        tok, slot = torch.where(mask[e])
        if tok.numel() == 0:
            continue
        q = p + "mlp.experts.%d." % e
        y = L.swiglu_mlp(x[tok], params[q + "gate_proj.weight"], params[q + "up_proj.weight"],
                         params[q + "down_proj.weight"])
        out.index_add_(0, tok, y * w[tok, slot].unsqueeze(-1))
    s = p + "mlp.shared_experts."
    return out.type(x.dtype) + L.swiglu_mlp(x, params[s + "gate_proj.weight"], params[s + "up_proj.weight"],
                                            params[s + "down_proj.weight"])


def forward(cfg, params, ids, gaps):
    b, t = ids.shape
    x = F.embedding(ids, params["model.embed_tokens.weight"])
    cos, sin = L.rope_cos_sin(cfg, torch.arange(t)[None].expand(b, t), x.dtype)
    eps = cfg.rms_norm_eps
    for layer in range(cfg.num_hidden_layers):
        p = "model.layers.%d." % layer
        x = x + attention(cfg, params, p + "self_attn.", L.rms_norm(x, params[p + "input_layernorm.weight"], eps),
                          cos, sin)
        h = L.rms_norm(x, params[p + "post_attention_layernorm.weight"], eps)
        if layer < cfg.first_k_dense_replace:
            x = x + L.swiglu_mlp(h, params[p + "mlp.gate_proj.weight"], params[p + "mlp.up_proj.weight"],
                                 params[p + "mlp.down_proj.weight"])
        else:
            x = x + moe(cfg, params, p, h.reshape(b * t, -1), gaps).view(b, t, -1)
    x = L.rms_norm(x, params["model.norm.weight"], eps)
    return F.linear(x, params["lm_head.weight"])


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(here, "..", "golden"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = Config(CONFIG)
    params = init_params(cfg, SEED)
    ids = torch.randint(1, cfg.vocab_size, (2, 7), generator=torch.Generator().manual_seed(SEED + 500),
                        dtype=torch.int64)
    leaves = {n: t.clone().requires_grad_(not n.endswith(BUFFER)) for n, t in params.items()}
    gaps = []
    loss = L.causal_lm_loss(forward(cfg, leaves, ids, gaps), ids)
    loss.backward()
    tokens, margin = L.greedy_uncached(lambda seq: forward(cfg, params, seq, gaps), ids[:1], N_NEW)
    if margin < MIN_MARGIN:
        raise SystemExit("deepseek_ref: a greedy argmax wins by %.1e only: pick another seed" % margin)
    if min(gaps) < MIN_ROUTE_GAP:
        raise SystemExit("deepseek_ref: routing choices %.1e apart at a boundary: pick another seed" % min(gaps))
    folder = os.path.join(args.out, "tiny_deepseek_v3")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
        f.write("\n")
    L.st_write(os.path.join(folder, "model.safetensors"), params, META)
    golden = {"input_ids": ids, "loss": loss.detach().reshape(1), "greedy": tokens}
    golden.update({"grad." + n: (t.grad.detach().clone() if t.grad is not None else torch.zeros_like(t))
                   for n, t in leaves.items()})
    L.st_write(os.path.join(folder, "golden.safetensors"), golden, META)
    print("tiny_deepseek_v3", json.dumps({"loss": loss.item(), "min_route_gap": min(gaps), "greedy": tokens.tolist(),
                                          "min_margin": margin}))


if __name__ == "__main__":
    main()
