"""Pure-PyTorch reference of Hugging Face Phi3ForCausalLM (transformers' modeling_phi3.py) and its
training step: Llama's block with the fused qkv_proj ([(heads + 2 kv_heads) x head_dim, hidden],
sliced into q, k and v) and gate_up_proj ([2 x intermediate, hidden], chunked into gate and up,
the MLP up * silu(gate)), a sliding window on every layer when sliding_window is given, and
rope_scaling type longrope (transformers' _compute_longrope_parameters: short_factor while the
sequence stays within original_max_position_embeddings, long_factor past it, cos and sin scaled
by sqrt(1 + ln(factor) / ln(original)), factor = max_position_embeddings / original).

Writes the goldens of two tiny configs (config.json, model.safetensors, golden.safetensors:
input_ids, loss, every gradient and the greedy tokens of the first row) as gemma_ref.py does, and
tests/golden/tiny_phi3_lora: PEFT's LoRA on tiny_phi3 with the fused matrices as targets
(qkv_proj, o_proj, gate_up_proj, down_proj: each adapter's B as wide as the fused output), as
lora_ref.py writes tiny_lora (adapter_config.json, adapter_model.safetensors with PEFT's names,
golden.safetensors: the loss and the gradient of every adapter tensor):

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


RANK, ALPHA, B_STD = 4, 8.0, 0.05
TARGETS = ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]
PREFIX = "base_model.model."


def linear(P, ad, mod, x):
    """nn.Linear, or PEFT's lora.Linear (dropout 0) where mod has an adapter."""
    y = F.linear(x, P[mod + ".weight"])
    if ad and mod in ad:
        a, b = ad[mod]
        y = y + F.linear(F.linear(x, a), b) * (ALPHA / RANK)
    return y


def forward(c, P, ids, ad=None):
    b, t = ids.shape
    hd, nq, nkv = dims(c)
    nh, kvh, eps = c["num_attention_heads"], c["num_key_value_heads"], c["rms_norm_eps"]
    x = F.embedding(ids, P["model.embed_tokens.weight"], padding_idx=c.get("pad_token_id"))
    cos, sin = rope(c, t, x.dtype)
    allowed = L.attention_mask_4d(None, t, t, c.get("sliding_window") or 0)
    for layer in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % layer
        y = L.rms_norm(x, P[p + "input_layernorm.weight"], eps)
        qkv = linear(P, ad, p + "self_attn.qkv_proj", y)
        q = qkv[..., :nq].view(b, t, nh, hd).transpose(1, 2)
        k = qkv[..., nq:nq + nkv].view(b, t, kvh, hd).transpose(1, 2)
        v = qkv[..., nq + nkv:].view(b, t, kvh, hd).transpose(1, 2)
        q = q * cos + L.rotate_half(q) * sin
        k = k * cos + L.rotate_half(k) * sin
        rep = nh // kvh
        a = L.attention(q, L.repeat_kv(k, rep), L.repeat_kv(v, rep), allowed)
        x = x + linear(P, ad, p + "self_attn.o_proj", a.transpose(1, 2).reshape(b, t, nq))
        y = L.rms_norm(x, P[p + "post_attention_layernorm.weight"], eps)
        gate, up = linear(P, ad, p + "mlp.gate_up_proj", y).chunk(2, dim=-1)
        x = x + linear(P, ad, p + "mlp.down_proj", up * F.silu(gate))
    x = L.rms_norm(x, P["model.norm.weight"], eps)
    return F.linear(x, P["lm_head.weight"])


def loss_fn(c, P, ids, ad=None):
    v = c["vocab_size"]
    logits = forward(c, P, ids, ad)
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


def write_lora(out, c):
    """PEFT's adapters on the fused matrices of tiny_phi3: A as kaiming_uniform_(a=sqrt(5)), B drawn
    non-zero (PEFT starts it at zero, which would leave A's gradient zero)."""
    g = torch.Generator().manual_seed(SEED + 7)
    P = {n: t.detach() for n, t in init_params(c, SEED).items()}
    ids = torch.randint(1, c["vocab_size"], (2, 7), generator=torch.Generator().manual_seed(SEED + 500),
                        dtype=torch.int64)
    ad = {}
    for layer in range(c["num_hidden_layers"]):
        for t in TARGETS:
            mod = "model.layers.%d.%s%s" % (layer, "mlp." if t in ("gate_up_proj", "down_proj") else "self_attn.", t)
            out_f, in_f = P[mod + ".weight"].shape
            a = (torch.rand((RANK, in_f), generator=g) * 2 - 1) / math.sqrt(in_f)
            ad[mod] = (a.requires_grad_(True), (torch.randn((out_f, RANK), generator=g) * B_STD).requires_grad_(True))
    loss = loss_fn(c, P, ids, ad)
    loss.backward()
    with torch.no_grad():  # the adapters must move the loss, and the fused B's every part
        if abs(loss_fn(c, P, ids).item() - loss.item()) < 1e-3:
            raise SystemExit("phi3_ref: the adapters barely move the loss")
    folder = os.path.join(out, "tiny_phi3_lora")
    os.makedirs(folder, exist_ok=True)
    named = {}
    for m, (a, b) in ad.items():
        named[PREFIX + m + ".lora_A.weight"] = a
        named[PREFIX + m + ".lora_B.weight"] = b
    L.st_write(os.path.join(folder, "adapter_model.safetensors"), {n: t.detach() for n, t in named.items()}, META)
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": "tiny_phi3", "r": RANK,
              "lora_alpha": ALPHA, "lora_dropout": 0.0, "target_modules": TARGETS, "bias": "none",
              "fan_in_fan_out": False, "inference_mode": True, "init_lora_weights": True, "use_rslora": False,
              "use_dora": False}
    with open(os.path.join(folder, "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    golden = {"input_ids": ids, "loss": loss.detach().reshape(1)}
    golden.update({"grad." + n: t.grad.detach().clone() for n, t in named.items()})
    L.st_write(os.path.join(folder, "golden.safetensors"), golden, META)
    print("tiny_phi3_lora", json.dumps({"loss": loss.item()}))


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(here, "..", "golden"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    write_case(args.out, "tiny_phi3", dict(CONFIG), (("sliding_window", None),))
    write_lora(args.out, dict(CONFIG))
    short = dict(LONGROPE["rope_scaling"], long_factor=LONGROPE["rope_scaling"]["short_factor"])
    write_case(args.out, "tiny_phi3_longrope", dict(LONGROPE),
               (("rope_scaling", None), ("rope_scaling", short), ("max_position_embeddings", 4)))


if __name__ == "__main__":
    main()
