"""Write tests/golden/tiny_qlora/golden.safetensors: a QLoRA step of the tiny untied model
(tests/golden/tiny_untied) in PyTorch, its frozen base in bitsandbytes' NF4.

    /usr/bin/python3 tests/reference/qlora_ref.py [--out tests/golden]

Each block's linear weight is quantised with double quantisation (nf4_ref.quantize, the
restatement of bitsandbytes' reference kernels that autograd_nf4 checks membill's codec against
code for code) and dequantised in float32 (dequantize_4bit), then cast to the compute dtype, as
bitsandbytes' MatMul4Bit does (dequantize_4bit(W).to(x.dtype)) in forward and in backward. The
embedding, the norms and lm_head stay unquantised (Linear4bit replaces the blocks' linears only).
The adapters on all seven projections start from tests/golden/tiny_lora (r 4, alpha 8, a non-zero
B) and alone require gradients, PEFT's lora.Linear forward (lora_ref.forward).

Two compute dtypes: fp32 (everything float32) and bf16 (the model and the adapters cast to
bfloat16, model.to(torch.bfloat16), the dequantised base in bfloat16). Per dtype: <dt>.loss,
<dt>.grad.<adapter>, and after two steps of torch.optim.Adam(lr=1e-3) on the same batch
<dt>.adam.<adapter> and <dt>.adam_losses. Also deq.<weight>: each NF4 weight dequantised (float32).
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref as L  # noqa: E402
import lora_ref as R  # noqa: E402
import nf4_ref as Q  # noqa: E402

META = {"format": "pt", "generator": "tests/reference/qlora_ref.py", "torch": torch.__version__}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def is_block_linear(name, t):
    return name.startswith("model.layers.") and t.dim() == 2


def nf4_roundtrip(w):
    flat = w.reshape(-1).float()
    return Q.dequantize(*Q.quantize(flat), flat.numel()).reshape(w.shape)


def adapters_from(path, dtype):
    """{"model.layers.i.<module>": (A, B)} from PEFT's file, as leaves of dtype."""
    t = L.st_read(path)
    ad = {}
    for name in t:
        if name.endswith(".lora_A.weight"):
            mod = name[len(R.PREFIX):-len(".lora_A.weight")]
            b = t[R.PREFIX + mod + ".lora_B.weight"]
            ad[mod] = (t[name].to(dtype).requires_grad_(True), b.to(dtype).requires_grad_(True))
    return ad


def run(cfg, base, ids, adapter_file, dtype, tag, out):
    b = {n: t.to(dtype) for n, t in base.items()}
    ad = adapters_from(adapter_file, dtype)
    loss = L.causal_lm_loss(R.forward(cfg, b, ad, ids), ids)
    loss.backward()
    out[tag + ".loss"] = loss.detach().float().reshape(1)
    out.update({tag + ".grad." + n: g.float() for n, g in R.named(ad, lambda t: t.grad.detach().clone()).items()})
    ad = adapters_from(adapter_file, dtype)
    opt = torch.optim.Adam([t for pair in ad.values() for t in pair], lr=1e-3)
    losses = []
    for _ in range(2):
        loss = L.causal_lm_loss(R.forward(cfg, b, ad, ids), ids)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    out[tag + ".adam_losses"] = torch.tensor(losses)
    out.update({tag + ".adam." + n: t.float() for n, t in R.named(ad, lambda t: t.detach().clone()).items()})
    return out[tag + ".loss"].item(), losses


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(here, "..", "golden"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    src = os.path.join(args.out, "tiny_untied")
    cfg = L.LlamaConfig.from_json(os.path.join(src, "config.json"))
    weights = {n: t.detach() for n, t in L.st_read(os.path.join(src, "model.safetensors")).items()}
    ids = L.st_read(os.path.join(src, "golden.safetensors"))["input_ids"]
    base, golden = {}, {"input_ids": ids}
    for n, t in weights.items():
        if is_block_linear(n, t):
            base[n] = nf4_roundtrip(t)
            golden["deq." + n] = base[n]
        else:
            base[n] = t
    adapter_file = os.path.join(args.out, "tiny_lora", "adapter_model.safetensors")
    summary = {}
    for tag, dtype in DTYPES.items():
        summary[tag] = run(cfg, base, ids, adapter_file, dtype, tag, golden)
    folder = os.path.join(args.out, "tiny_qlora")
    os.makedirs(folder, exist_ok=True)
    L.st_write(os.path.join(folder, "golden.safetensors"), golden, META)
    print("tiny_qlora", json.dumps(summary))


if __name__ == "__main__":
    main()
