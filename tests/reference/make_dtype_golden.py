"""Write tests/golden/<tiny>/golden_dtype.safetensors: the tiny models in 16 bits and quantised.

    /usr/bin/python3 tests/reference/make_dtype_golden.py [--out tests/golden]

From the same weights as make_golden.py (each folder's model.safetensors), with PyTorch's own
kernels (CPU, one thread, fixed inputs: a rerun writes the same file on the same machine):
  bf16.*      the model cast to bfloat16 (model.to(torch.bfloat16)): loss, gradients (bfloat16,
              stored as float32), the weights after two steps of torch.optim.Adam(lr=1e-3) on the
              bfloat16 parameters, and the two losses;
  mixed.*     bf16-mixed: float32 master weights and Adam state, a bfloat16 copy of the weights
              for each forward and backward, the master stepped on the gradients made float32;
              the bfloat16 weights after two steps, and the losses;
  autocast.*  float32 parameters under torch.autocast("cpu", dtype=torch.bfloat16): loss, gradients;
  int8.logits quantize_dynamic's int8 linears (torch.ops.quantized.linear_dynamic on the build's
              default engine, reduce_range as nn.quantized.dynamic.Linear asks) with the embedding table quantised the
              same way (per-tensor symmetric int8) and read back as float: logits [2, 7, V];
  int4.logits float32 math on int4 weights dequantised (groups of 32, scale amax / 7 in float16,
              round half to even, clamp to [-8, 7]): logits [2, 7, V];
  bf16.logits the bfloat16 model's logits (float32 copy).
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref as L  # noqa: E402

FOLDERS = ["tiny_tied", "tiny_untied"]
META = {"format": "pt", "generator": "tests/reference/make_dtype_golden.py",
        "torch": torch.__version__, "quantized_engine": torch.backends.quantized.engine}
GROUP = 32


def load(folder):
    cfg = L.LlamaConfig(L.json.load(open(os.path.join(folder, "config.json"))))
    weights = L.st_read(os.path.join(folder, "model.safetensors"))
    ids = L.st_read(os.path.join(folder, "golden.safetensors"))["input_ids"]
    return cfg, weights, ids


def leaves(weights, dtype):
    return {n: t.detach().clone().to(dtype).requires_grad_(True) for n, t in weights.items()}


def grads_of(params):
    return {n: (torch.zeros_like(t) if t.grad is None else t.grad.detach().clone()).float()
            for n, t in params.items()}


def bf16_case(cfg, weights, ids, out):
    p = leaves(weights, torch.bfloat16)
    loss = L.loss_fn(cfg, p, ids)
    loss.backward()
    out["bf16.loss"] = loss.detach().float().reshape(1)
    out.update({"bf16.grad." + n: g for n, g in grads_of(p).items()})
    with torch.no_grad():
        out["bf16.logits"] = L.forward(cfg, leaves(weights, torch.bfloat16), ids).float()
    p = leaves(weights, torch.bfloat16)
    opt = torch.optim.Adam(list(p.values()), lr=1e-3, foreach=False)
    losses = []
    for _ in range(2):
        loss = L.loss_fn(cfg, p, ids)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    out["bf16.adam_losses"] = torch.tensor(losses)
    out.update({"bf16.adam." + n: t.detach().float() for n, t in p.items()})


def mixed_case(cfg, weights, ids, out):
    master = {n: t.detach().clone().float().requires_grad_(True) for n, t in weights.items()}
    opt = torch.optim.Adam(list(master.values()), lr=1e-3, foreach=False)
    losses = []
    for _ in range(2):
        half = {n: t.detach().to(torch.bfloat16).requires_grad_(True) for n, t in master.items()}
        loss = L.loss_fn(cfg, half, ids)
        loss.backward()
        for n, t in master.items():
            t.grad = half[n].grad.float() if half[n].grad is not None else None
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    out["mixed.adam_losses"] = torch.tensor(losses)
    out.update({"mixed.adam." + n: t.detach().to(torch.bfloat16).float() for n, t in master.items()})


def autocast_case(cfg, weights, ids, out):
    p = leaves(weights, torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = L.loss_fn(cfg, p, ids)
    loss.float().backward()
    out["autocast.loss"] = loss.detach().float().reshape(1)
    out.update({"autocast.grad." + n: g for n, g in grads_of(p).items()})


def q8_weight(w):
    """MinMaxObserver(qint8, per_tensor_symmetric), as quantize_dynamic observes a Linear weight."""
    obs = torch.ao.quantization.MinMaxObserver(dtype=torch.qint8, qscheme=torch.per_tensor_symmetric)
    obs(w)
    scale, zp = obs.calculate_qparams()
    return torch.quantize_per_tensor(w, float(scale), int(zp), torch.qint8)


def int8_case(cfg, weights, ids, out):
    packed = {}

    def qlinear(x, w, b=None):
        key = id(w)
        if key not in packed:
            packed[key] = torch.ops.quantized.linear_prepack(q8_weight(w.detach()), b)
        shape = x.shape
        y = torch.ops.quantized.linear_dynamic(x.reshape(-1, shape[-1]).contiguous(), packed[key], True)
        return y.reshape(*shape[:-1], y.shape[-1])

    w = {n: t.detach().clone() for n, t in weights.items()}
    w["model.embed_tokens.weight"] = q8_weight(w["model.embed_tokens.weight"]).dequantize()
    if not cfg.tie_word_embeddings:
        pass  # lm_head.weight goes through qlinear like every Linear
    real = F.linear
    L.F.linear = qlinear
    try:
        with torch.no_grad():
            if cfg.tie_word_embeddings:  # the head reads the same int8 values as the embedding
                w_head = weights["model.embed_tokens.weight"].detach().clone()
                orig = L.lm_head_weight
                L.lm_head_weight = lambda c, p: w_head
                try:
                    out["int8.logits"] = L.forward(cfg, w, ids).float()
                finally:
                    L.lm_head_weight = orig
            else:
                out["int8.logits"] = L.forward(cfg, w, ids).float()
    finally:
        L.F.linear = real


def q4_dequant(w):
    rows, cols = w.shape
    out = torch.empty_like(w)
    for g0 in range(0, cols, GROUP):
        blk = w[:, g0:g0 + GROUP]
        amax = blk.abs().amax(dim=1, keepdim=True)
        s = torch.where(amax > 0, amax / 7.0, torch.ones_like(amax)).to(torch.float16).float()
        q = torch.clamp(torch.round(blk / s), -8, 7)  # torch.round: half to even
        out[:, g0:g0 + GROUP] = q * s
    return out


def int4_case(cfg, weights, ids, out):
    w = {n: (q4_dequant(t.detach()) if t.dim() == 2 else t.detach().clone()) for n, t in weights.items()}
    with torch.no_grad():
        out["int4.logits"] = L.forward(cfg, w, ids).float()


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(here, "..", "golden"))
    a = ap.parse_args()
    torch.set_num_threads(1)
    for name in FOLDERS:
        folder = os.path.join(a.out, name)
        cfg, weights, ids = load(folder)
        out = {}
        bf16_case(cfg, weights, ids, out)
        mixed_case(cfg, weights, ids, out)
        autocast_case(cfg, weights, ids, out)
        int8_case(cfg, weights, ids, out)
        int4_case(cfg, weights, ids, out)
        f32 = L.forward(cfg, leaves(weights, torch.float32), ids).detach()
        for k in ("bf16.logits", "int8.logits", "int4.logits"):
            moved = (out[k] - f32).abs().max().item()
            if not moved > 1e-4:
                raise SystemExit("make_dtype_golden: %s: %s does not move the logits (%.1e)" % (name, k, moved))
            print("%s %s: max |logits - float32's| %.3g" % (name, k, moved))
        print("%s: loss bf16 %.6f autocast %.6f, bf16 Adam losses %s, mixed %s" % (
            name, out["bf16.loss"].item(), out["autocast.loss"].item(), out["bf16.adam_losses"].tolist(),
            out["mixed.adam_losses"].tolist()))
        L.st_write(os.path.join(folder, "golden_dtype.safetensors"), out, META)


if __name__ == "__main__":
    main()
