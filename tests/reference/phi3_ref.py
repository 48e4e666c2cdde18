"""Pure-PyTorch reference of Hugging Face Phi3ForCausalLM (transformers' modeling_phi3.py) and its
training step: Llama's block with the fused qkv_proj ([(heads + 2 kv_heads) x head_dim, hidden],
sliced into q, k and v) and gate_up_proj ([2 x intermediate, hidden], chunked into gate and up,
the MLP up * silu(gate)), a sliding window on every layer when sliding_window is given, and
rope_scaling type longrope (transformers' _compute_longrope_parameters: short_factor while the
sequence stays within original_max_position_embeddings, long_factor past it, cos and sin scaled
by sqrt(1 + ln(factor) / ln(original)), factor = max_position_embeddings / original).

Writes the goldens of two tiny configs (config.json, model.safetensors, golden.safetensors:
input_ids, loss, every gradient and the greedy tokens of the first row) as gemma_ref.py does:

    /usr/bin/python3 tests/reference/phi3_ref.py [--out tests/golden]
"""
import argparse
import json
import math
import os
import sys
from collections import OrderedDict

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref as L  # noqa: E402  (rms_norm, rotate_half, attention_mask_4d, attention, st_write)

CONFIG = {
    "model_type": "phi3", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
    "max_position_embeddings": 64, "original_max_position_embeddings": 64, "rope_theta": 10000.0,
    "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "sliding_window": 4, "pad_token_id": 0,
    "hidden_act": "silu", "attention_dropout": 0.0, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
    "rope_scaling": None,
}
# Phi-3-mini-128k's rope_scaling at a tiny size: 7 tokens past an original 4, so the long factors
HEAD_DIM = 16
LONGROPE = dict(CONFIG, max_position_embeddings=16, original_max_position_embeddings=4, sliding_window=None,
                num_hidden_layers=2, rope_scaling={
                    "type": "longrope",
                    "short_factor": [1.0 + 0.05 * j for j in range(HEAD_DIM // 2)],
                    "long_factor": [1.0 + 0.9 * j for j in range(HEAD_DIM // 2)]})
SEED = 3003
WEIGHT_STD = 0.2
META = {"format": "pt", "generator": "tests/reference/phi3_ref.py"}


def dims(c):
    hd = c["hidden_size"] // c["num_attention_heads"]
    return hd, c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd


def param_shapes(c):
    h, i = c["hidden_size"], c["intermediate_size"]
    _, nq, nkv = dims(c)
    s = OrderedDict()
    s["model.embed_tokens.weight"] = (c["vocab_size"], h)
    for layer in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % layer
        s[p + "self_attn.qkv_proj.weight"] = (nq + 2 * nkv, h)
        s[p + "self_attn.o_proj.weight"] = (h, nq)
        s[p + "mlp.gate_up_proj.weight"] = (2 * i, h)
        s[p + "mlp.down_proj.weight"] = (h, i)
        s[p + "input_layernorm.weight"] = (h,)
        s[p + "post_attention_layernorm.weight"] = (h,)
    s["model.norm.weight"] = (h,)
    s["lm_head.weight"] = (c["vocab_size"], h)
    return s


def init_params(c, seed):
    g = torch.Generator().manual_seed(seed)
    out = OrderedDict()
    for name, shape in param_shapes(c).items():
        if name.endswith("norm.weight"):
            t = 1.0 + 0.1 * torch.randn(shape, generator=g)
        else:
            t = torch.randn(shape, generator=g) * WEIGHT_STD
        out[name] = t.requires_grad_(True)
    return out


def longrope(c, t):
    """(inv_freq, attention factor) for a sequence of t positions."""
    rs, hd = c["rope_scaling"], dims(c)[0]
    orig = c["original_max_position_embeddings"]
    factor = c["max_position_embeddings"] / orig
    scale = rs.get("attention_factor")
    if scale is None:
        scale = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
    ext = torch.tensor(rs["long_factor"] if t > orig else rs["short_factor"], dtype=torch.float32)
    shape = torch.arange(0, hd, 2, dtype=torch.int64).float() / hd
    return 1.0 / (ext * c["rope_theta"] ** shape), scale


def rope(c, t, dtype):
    hd = dims(c)[0]
    if c.get("rope_scaling"):
        inv, scale = longrope(c, t)
    else:
        inv, scale = 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd)), 1.0
    freqs = torch.arange(t).float()[:, None] * inv[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * scale).to(dtype)[None, None], (emb.sin() * scale).to(dtype)[None, None]


def forward(c, P, ids):
    b, t = ids.shape
    hd, nq, nkv = dims(c)
    nh, kvh, eps = c["num_attention_heads"], c["num_key_value_heads"], c["rms_norm_eps"]
    x = F.embedding(ids, P["model.embed_tokens.weight"], padding_idx=c.get("pad_token_id"))
    cos, sin = rope(c, t, x.dtype)
    allowed = L.attention_mask_4d(None, t, t, c.get("sliding_window") or 0)
    for layer in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % layer
        y = L.rms_norm(x, P[p + "input_layernorm.weight"], eps)
        qkv = F.linear(y, P[p + "self_attn.qkv_proj.weight"])
        q = qkv[..., :nq].view(b, t, nh, hd).transpose(1, 2)
        k = qkv[..., nq:nq + nkv].view(b, t, kvh, hd).transpose(1, 2)
        v = qkv[..., nq + nkv:].view(b, t, kvh, hd).transpose(1, 2)
        q = q * cos + L.rotate_half(q) * sin
        k = k * cos + L.rotate_half(k) * sin
        rep = nh // kvh
        a = L.attention(q, L.repeat_kv(k, rep), L.repeat_kv(v, rep), allowed)
        x = x + F.linear(a.transpose(1, 2).reshape(b, t, nq), P[p + "self_attn.o_proj.weight"])
        y = L.rms_norm(x, P[p + "post_attention_layernorm.weight"], eps)
        gate, up = F.linear(y, P[p + "mlp.gate_up_proj.weight"]).chunk(2, dim=-1)
        x = x + F.linear(up * F.silu(gate), P[p + "mlp.down_proj.weight"])
    x = L.rms_norm(x, P["model.norm.weight"], eps)
    return F.linear(x, P["lm_head.weight"])


def loss_fn(c, P, ids):
    v = c["vocab_size"]
    logits = forward(c, P, ids)
    return F.cross_entropy(logits[:, :-1].reshape(-1, v).float(), ids[:, 1:].reshape(-1))


N_NEW = 8
MIN_MARGIN = 1e-3


def greedy(c, P, prompt):
    """Greedy tokens, each from a whole forward of the sequence so far, checked to win their argmax
    by MIN_MARGIN."""
    ids = prompt.clone()
    out = []
    with torch.no_grad():
        for _ in range(N_NEW):
            top = forward(c, P, ids)[:, -1].topk(2, dim=-1)
            if (top.values[:, 0] - top.values[:, 1]).min().item() < MIN_MARGIN:
                raise SystemExit("phi3_ref: greedy argmax margin below %.0e" % MIN_MARGIN)
            out.append(top.indices[:, :1])
            ids = torch.cat([ids, out[-1]], dim=1)
    return torch.cat(out, dim=1)


def write_case(out, name, c, checks):
    g = torch.Generator().manual_seed(SEED + 500)
    ids = torch.randint(1, c["vocab_size"], (2, 7), generator=g, dtype=torch.int64)
    P = init_params(c, SEED)
    loss = loss_fn(c, P, ids)
    loss.backward()
    for field, value in checks:  # each feature must move the loss, or the golden proves nothing
        with torch.no_grad():
            moved = abs(loss_fn(dict(c, **{field: value}), P, ids).item() - loss.item())
        if moved < 1e-4:
            raise SystemExit("phi3_ref: %s: %s moves the loss by %.1e only" % (name, field, moved))
    folder = os.path.join(out, name)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(dict(c, architectures=["Phi3ForCausalLM"]), f, indent=2, sort_keys=True)
        f.write("\n")
    L.st_write(os.path.join(folder, "model.safetensors"), {n: t.detach() for n, t in P.items()}, META)
    golden = {"input_ids": ids, "loss": loss.detach().reshape(1)}
    golden.update({"grad." + n: t.grad.detach().clone() for n, t in P.items()})
    golden["greedy"] = greedy(c, P, ids[:1])
    L.st_write(os.path.join(folder, "golden.safetensors"), golden, META)
    print(name, json.dumps({"loss": loss.item()}))


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(here, "..", "golden"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    write_case(args.out, "tiny_phi3", dict(CONFIG), (("sliding_window", None),))
    short = dict(LONGROPE["rope_scaling"], long_factor=LONGROPE["rope_scaling"]["short_factor"])
    write_case(args.out, "tiny_phi3_longrope", dict(LONGROPE),
               (("rope_scaling", None), ("rope_scaling", short), ("max_position_embeddings", 4)))


if __name__ == "__main__":
    main()
