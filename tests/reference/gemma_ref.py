"""Pure-PyTorch reference of Hugging Face Gemma2ForCausalLM (transformers' modeling_gemma2.py) and
Gemma3ForCausalLM (modeling_gemma3.py: q_norm and k_norm, every sliding_window_pattern-th layer
full, the sliding ones' RoPE on rope_local_base_freq),
its training step and greedy generation: RMSNorm with (1 + weight) in float32, the norms before and after each sub-block,
GeLU-tanh MLP, embeddings times sqrt(hidden_size) (in their dtype), attention scaled by
query_pre_attn_scalar^-1/2 with its scores soft-capped (tanh) before the mask, sliding layers
alternating with full ones (the first sliding), the final logits soft-capped.

Writes the golden of a tiny config (config.json, model.safetensors, golden.safetensors: input_ids,
loss, every gradient and the greedy tokens of the first row) as make_golden.py writes the Llama
families':

    /usr/bin/python3 tests/reference/gemma_ref.py [--out tests/golden]
"""
import json
import math
import os
import sys
from collections import OrderedDict

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref as L  # noqa: E402  (attention_mask_4d, rope_cos_sin's helpers, st_write)

CONFIG = {
    "model_type": "gemma2", "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 24, "vocab_size": 256,
    "max_position_embeddings": 128, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True, "query_pre_attn_scalar": 20, "attn_logit_softcapping": 1.0,
    "final_logit_softcapping": 3.0, "sliding_window": 3, "hidden_activation": "gelu_pytorch_tanh",
    "attention_dropout": 0.0, "attention_bias": False,
}
# Gemma 3: no caps, q_norm and k_norm, one full layer in 3, the local layers' RoPE base 10
GEMMA3 = dict(CONFIG, model_type="gemma3_text", attn_logit_softcapping=None, final_logit_softcapping=None,
              sliding_window_pattern=3, rope_theta=1000.0, rope_local_base_freq=10.0, num_hidden_layers=3)
SEED = 2003
WEIGHT_STD = 0.2
NORM_STD = 0.1  # Gemma's norm weights are offsets from 1: N(0, 0.1) so that a dropped 1 + shows
META = {"format": "pt", "generator": "tests/reference/gemma_ref.py"}


def param_shapes(c):
    h, i, hd = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    nq, nkv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    s = OrderedDict()
    s["model.embed_tokens.weight"] = (c["vocab_size"], h)
    for layer in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % layer
        s[p + "self_attn.q_proj.weight"] = (nq, h)
        s[p + "self_attn.k_proj.weight"] = (nkv, h)
        s[p + "self_attn.v_proj.weight"] = (nkv, h)
        s[p + "self_attn.o_proj.weight"] = (h, nq)
        if c["model_type"] == "gemma3_text":
            s[p + "self_attn.q_norm.weight"] = (hd,)
            s[p + "self_attn.k_norm.weight"] = (hd,)
        s[p + "mlp.gate_proj.weight"] = (i, h)
        s[p + "mlp.up_proj.weight"] = (i, h)
        s[p + "mlp.down_proj.weight"] = (h, i)
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm"):
            s[p + n + ".weight"] = (h,)
    s["model.norm.weight"] = (h,)
    return s


def init_params(c, seed):
    g = torch.Generator().manual_seed(seed)
    out = OrderedDict()
    for name, shape in param_shapes(c).items():
        std = NORM_STD if name.endswith("norm.weight") else WEIGHT_STD
        out[name] = (torch.randn(shape, generator=g) * std).requires_grad_(True)
    return out


def rms_norm(x, w, eps):
    """Gemma2RMSNorm: x.float() normed, times (1 + w.float()), cast back."""
    xf = x.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (out * (1.0 + w.float())).type_as(x)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def sliding(c, layer):
    """Gemma 2: every other layer, the first sliding; Gemma 3: all but every pattern-th."""
    return bool((layer + 1) % c.get("sliding_window_pattern", 2))


def rope(c, t, dtype, theta=None):
    hd = c["head_dim"]
    inv = 1.0 / ((theta or c["rope_theta"]) ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    freqs = torch.arange(t).float()[:, None] * inv[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype)[None, None], emb.sin().to(dtype)[None, None]


def attention(c, q, k, v, window):
    """eager_attention_forward with Gemma 2's scaling and soft-cap; the mask after the cap."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    s = torch.matmul(q, k.transpose(2, 3)) * c["query_pre_attn_scalar"] ** -0.5
    cap = c.get("attn_logit_softcapping")
    if cap:
        s = torch.tanh(s / cap) * cap
    t = q.shape[2]
    qp, kp = torch.arange(t)[:, None], torch.arange(t)[None, :]
    allowed = kp <= qp
    if window:
        allowed = allowed & (kp > qp - window)
    s = s.masked_fill(~allowed[None, None], torch.finfo(s.dtype).min)
    p = F.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(p, v)


def forward(c, P, ids):
    b, t = ids.shape
    h, hd, nh, nkv = c["hidden_size"], c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
    eps = c["rms_norm_eps"]
    x = F.embedding(ids, P["model.embed_tokens.weight"])
    x = x * torch.tensor(h ** 0.5, dtype=x.dtype)
    cos_g, sin_g = rope(c, t, x.dtype)
    cos_l, sin_l = rope(c, t, x.dtype, c.get("rope_local_base_freq")) if "rope_local_base_freq" in c else (cos_g, sin_g)
    for layer in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % layer
        slides = sliding(c, layer)
        cos, sin = (cos_l, sin_l) if slides else (cos_g, sin_g)
        r = x
        y = rms_norm(x, P[p + "input_layernorm.weight"], eps)
        q = F.linear(y, P[p + "self_attn.q_proj.weight"]).view(b, t, nh, hd).transpose(1, 2)
        k = F.linear(y, P[p + "self_attn.k_proj.weight"]).view(b, t, nkv, hd).transpose(1, 2)
        v = F.linear(y, P[p + "self_attn.v_proj.weight"]).view(b, t, nkv, hd).transpose(1, 2)
        if c["model_type"] == "gemma3_text":
            q, k = rms_norm(q, P[p + "self_attn.q_norm.weight"], eps), rms_norm(k, P[p + "self_attn.k_norm.weight"], eps)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        a = attention(c, q, k, v, c["sliding_window"] if slides else 0)
        a = F.linear(a.transpose(1, 2).reshape(b, t, nh * hd), P[p + "self_attn.o_proj.weight"])
        x = r + rms_norm(a, P[p + "post_attention_layernorm.weight"], eps)
        r = x
        y = rms_norm(x, P[p + "pre_feedforward_layernorm.weight"], eps)
        m = F.gelu(F.linear(y, P[p + "mlp.gate_proj.weight"]), approximate="tanh") * F.linear(
            y, P[p + "mlp.up_proj.weight"])
        m = F.linear(m, P[p + "mlp.down_proj.weight"])
        x = r + rms_norm(m, P[p + "post_feedforward_layernorm.weight"], eps)
    x = rms_norm(x, P["model.norm.weight"], eps)
    logits = F.linear(x, P["model.embed_tokens.weight"])
    cap = c.get("final_logit_softcapping")
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


def loss_fn(c, P, ids):
    v = c["vocab_size"]
    logits = forward(c, P, ids)
    return F.cross_entropy(logits[:, :-1].reshape(-1, v).float(), ids[:, 1:].reshape(-1))


N_NEW = 8
MIN_MARGIN = 1e-3


def greedy(c, P, prompt):
    """Greedy tokens, each from a whole forward of the sequence so far (no cache), checked to win
    their argmax by MIN_MARGIN."""
    ids = prompt.clone()
    out = []
    with torch.no_grad():
        for _ in range(N_NEW):
            last = forward(c, P, ids)[:, -1]
            top = last.topk(2, dim=-1)
            if (top.values[:, 0] - top.values[:, 1]).min().item() < MIN_MARGIN:
                raise SystemExit("gemma_ref: greedy argmax margin below %.0e" % MIN_MARGIN)
            nxt = top.indices[:, :1]
            out.append(nxt)
            ids = torch.cat([ids, nxt], dim=1)
    return torch.cat(out, dim=1)


def write_case(out, name, c, cls, checks):
    g = torch.Generator().manual_seed(SEED + 500)
    ids = torch.randint(1, c["vocab_size"], (2, 7), generator=g, dtype=torch.int64)
    P = init_params(c, SEED)
    loss = loss_fn(c, P, ids)
    loss.backward()
    L.check_moves("gemma_ref", name, loss, lambda f, v: loss_fn(dict(c, **{f: v}), P, ids), checks)
    folder = L.write_model_folder(out, name, dict(c, architectures=[cls]), P, META, sort_keys=True)
    golden = L.loss_golden(ids, loss, P)
    golden["greedy"] = greedy(c, P, ids[:1])
    return golden, P, ids, folder, loss


def main():
    args = L.golden_args(__doc__)
    c = dict(CONFIG)
    golden, P, ids, folder, loss = write_case(
        args.out, "tiny_gemma2", c, "Gemma2ForCausalLM",
        (("attn_logit_softcapping", None), ("final_logit_softcapping", None), ("sliding_window", 0),
         ("query_pre_attn_scalar", c["head_dim"])))
    # the attention's soft-cap and the window must change the greedy tokens (the final cap cannot:
    # tanh keeps the argmax)
    for field, value in (("attn_logit_softcapping", None), ("sliding_window", 0)):
        if torch.equal(greedy(dict(c, **{field: value}), P, ids[:1]), golden["greedy"]):
            raise SystemExit("gemma_ref: %s leaves the greedy tokens as they are" % field)
    L.st_write(os.path.join(folder, "golden.safetensors"), golden, META)
    print("tiny_gemma2", json.dumps({"loss": loss.item()}))
    golden, P, ids, folder, loss = write_case(
        args.out, "tiny_gemma3", GEMMA3, "Gemma3ForCausalLM",
        (("sliding_window", 0), ("rope_local_base_freq", GEMMA3["rope_theta"]), ("sliding_window_pattern", 2)))
    L.st_write(os.path.join(folder, "golden.safetensors"), golden, META)
    print("tiny_gemma3", json.dumps({"loss": loss.item()}))


if __name__ == "__main__":
    main()
