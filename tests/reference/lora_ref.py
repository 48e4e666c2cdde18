"""Write tests/golden/tiny_lora/ from a PyTorch reference of PEFT's LoRA (lora.Linear) on the
tiny untied model (tests/golden/tiny_untied).

    /usr/bin/python3 tests/reference/lora_ref.py [--out tests/golden]

Each target's frozen base weight W computes base(x), and the adapter adds
lora_B(lora_A(x)) * (lora_alpha / r), as PEFT's forward does (dropout 0: nn.Identity). Only
lora_A and lora_B require gradients. A is drawn as PEFT draws it (kaiming_uniform_ with
a = sqrt(5)); B is drawn non-zero (PEFT starts it at zero, which would leave A's gradient zero),
so that every gradient is meaningful: the adapter goes to a file that membill loads.

Writes adapter_model.safetensors and adapter_config.json as PEFT's save_pretrained does
(tensor names "base_model.model.<module>.lora_A.weight"), and golden.safetensors: the loss,
grad.<name> of every adapter tensor, and adam.<name> after two Adam steps (lr 1e-3) on the
same batch, with adam_losses.
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

RANK, ALPHA = 4, 8.0
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
B_STD = 0.05
SEED = 2024
PREFIX = "base_model.model."
META = {"format": "pt", "generator": "tests/reference/lora_ref.py"}


def module_of(name):
    return ("self_attn." if name in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp.") + name


def make_adapters(cfg, base, g):
    """{"model.layers.i.<module>": (A, B)}: A as kaiming_uniform_(a=sqrt(5)), B ~ N(0, B_STD)."""
    ad = {}
    for layer in range(cfg.num_hidden_layers):
        for t in TARGETS:
            mod = "model.layers.%d.%s" % (layer, module_of(t))
            out_f, in_f = base[mod + ".weight"].shape
            bound = 1.0 / math.sqrt(in_f)  # gain sqrt(2 / (1 + 5)) x sqrt(3 / fan_in)
            a = (torch.rand((RANK, in_f), generator=g) * 2 - 1) * bound
            b = torch.randn((out_f, RANK), generator=g) * B_STD
            ad[mod] = (a, b)
    return ad


def lora_linear(base, ad, mod, x):
    """PEFT's lora.Linear.forward with dropout 0."""
    result = F.linear(x, base[mod + ".weight"], base.get(mod + ".bias"))
    if mod in ad:
        a, b = ad[mod]
        result = result + F.linear(F.linear(x, a), b) * (ALPHA / RANK)
    return result


def forward(cfg, base, ad, ids):
    bsz, t = ids.shape
    pos = torch.arange(t)[None].expand(bsz, t)
    x = F.embedding(ids, base["model.embed_tokens.weight"])
    cos, sin = L.rope_cos_sin(cfg, pos, x.dtype)
    eps, nh, nkv, hd = cfg.rms_norm_eps, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    for layer in range(cfg.num_hidden_layers):
        p = "model.layers.%d." % layer
        allowed = L.attention_mask_4d(None, t, t, cfg.layer_windows[layer])
        h = L.rms_norm(x, base[p + "input_layernorm.weight"], eps)
        q = lora_linear(base, ad, p + "self_attn.q_proj", h).view(bsz, t, nh, hd).transpose(1, 2)
        k = lora_linear(base, ad, p + "self_attn.k_proj", h).view(bsz, t, nkv, hd).transpose(1, 2)
        v = lora_linear(base, ad, p + "self_attn.v_proj", h).view(bsz, t, nkv, hd).transpose(1, 2)
        q, k = L.apply_rope(q, cos, sin), L.apply_rope(k, cos, sin)
        o = L.attention(q, L.repeat_kv(k, nh // nkv), L.repeat_kv(v, nh // nkv), allowed)
        o = o.transpose(1, 2).reshape(bsz, t, nh * hd)
        x = x + lora_linear(base, ad, p + "self_attn.o_proj", o)
        h = L.rms_norm(x, base[p + "post_attention_layernorm.weight"], eps)
        g = F.silu(lora_linear(base, ad, p + "mlp.gate_proj", h)) * lora_linear(base, ad, p + "mlp.up_proj", h)
        x = x + lora_linear(base, ad, p + "mlp.down_proj", g)
    x = L.rms_norm(x, base["model.norm.weight"], eps)
    return F.linear(x, L.lm_head_weight(cfg, base))


def leaves(ad):
    return {m: (a.clone().requires_grad_(True), b.clone().requires_grad_(True)) for m, (a, b) in ad.items()}


def named(ad, what):
    """{"base_model.model.<module>.lora_A.weight": tensor} of the adapters (what: the tensor)."""
    out = {}
    for m, (a, b) in ad.items():
        out[PREFIX + m + ".lora_A.weight"] = what(a)
        out[PREFIX + m + ".lora_B.weight"] = what(b)
    return out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(here, "..", "golden"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    src = os.path.join(args.out, "tiny_untied")
    cfg = L.LlamaConfig.from_json(os.path.join(src, "config.json"))
    base = {n: t.detach() for n, t in L.st_read(os.path.join(src, "model.safetensors")).items()}
    ids = L.st_read(os.path.join(src, "golden.safetensors"))["input_ids"]
    ad = make_adapters(cfg, base, torch.Generator().manual_seed(SEED))

    folder = os.path.join(args.out, "tiny_lora")
    os.makedirs(folder, exist_ok=True)
    L.st_write(os.path.join(folder, "adapter_model.safetensors"), named(ad, lambda t: t), META)
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": "tiny_untied",
              "r": RANK, "lora_alpha": ALPHA, "lora_dropout": 0.0, "target_modules": TARGETS,
              "bias": "none", "fan_in_fan_out": False, "inference_mode": True,
              "init_lora_weights": True, "use_rslora": False, "use_dora": False}
    with open(os.path.join(folder, "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")

    golden = {"input_ids": ids}
    lv = leaves(ad)
    loss = L.causal_lm_loss(forward(cfg, base, lv, ids), ids)
    loss.backward()
    golden["loss"] = loss.detach().reshape(1)
    golden.update({"grad." + n: t for n, t in named(lv, lambda t: t.grad.detach().clone()).items()})

    lv = leaves(ad)
    opt = torch.optim.Adam([t for pair in lv.values() for t in pair], lr=1e-3)
    losses = []
    for _ in range(2):
        loss = L.causal_lm_loss(forward(cfg, base, lv, ids), ids)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    golden["adam_losses"] = torch.tensor(losses)
    golden.update({"adam." + n: t for n, t in named(lv, lambda t: t.detach().clone()).items()})
    L.st_write(os.path.join(folder, "golden.safetensors"), golden, META)
    print("tiny_lora", json.dumps({"loss": golden["loss"].item(), "adam_losses": losses}))


if __name__ == "__main__":
    main()
