"""Write tests/golden/nf4/golden.safetensors: bitsandbytes' NF4 with double quantisation
(quantize_4bit(quant_type="nf4", compress_statistics=True)), as its reference (default-backend)
kernels compute it, restated in plain PyTorch.

    /usr/bin/python3 tests/reference/nf4_ref.py [--out tests/golden]

4 bits: blocks of 64 of the flattened tensor, each scaled by its absmax (a full block multiplies
by the reciprocal, a last partial one divides), clamped to [-1, 1], bucketized against the
midpoints of the 16 NF4 values, two a byte with element 2i in the high nibble (an odd count
padded with a scaled 0). The absmaxes: their mean taken off (offset), then blockwise 8 bits in
blocks of 256 against the signed dynamic map (create_dynamic_map()), with a float32 absmax each.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref as L  # noqa: E402

NF4 = [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
       -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
       0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
       0.7229568362236023, 1.0]
N = 64 * 600 + 37  # a partial last block of 64, and of 256 blocks
META = {"format": "pt", "generator": "tests/reference/nf4_ref.py"}


def dynamic_map():
    """create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8)."""
    data = []
    for i in range(7):
        items = 2 ** i + 1
        bounds = torch.linspace(0.1, 1, items, dtype=torch.float32)
        means = (bounds[:-1] + bounds[1:]) / 2.0
        data += ((10 ** (-6 + i)) * means).tolist()
        data += (-(10 ** (-6 + i)) * means).tolist()
    data += [0, 1.0]
    assert len(data) == 256
    data.sort()
    return torch.tensor(data, dtype=torch.float32)


def blockwise(a, code, bs):
    """Indices of a into the sorted code, block by block, and each block's absmax."""
    n = a.numel()
    full = n - n % bs
    blocks = a[:full].reshape(-1, bs)
    absmax = blocks.abs().max(dim=-1)[0]
    scaled = torch.clamp(blocks * (1.0 / absmax.clamp(min=1e-38).view(-1, 1)), -1, 1).reshape(-1)
    if n % bs:
        am = a[full:].abs().max().clamp(min=1e-38)
        absmax = torch.cat([absmax, am.unsqueeze(0)])
        scaled = torch.cat([scaled, torch.clamp(a[full:] / am, -1, 1)])
    return scaled, absmax


def quantize(x):
    """bitsandbytes' quantize_4bit(nf4, compress_statistics=True) of a flat float32 x: the packed
    indices, the 8-bit absmaxes, their float32 absmaxes and the offset."""
    code4 = torch.tensor(NF4, dtype=torch.float32)
    scaled, absmax = blockwise(x, code4, 64)
    if scaled.numel() % 2:
        scaled = torch.nn.functional.pad(scaled, (0, 1))
    q = torch.bucketize(scaled, (code4[:-1] + code4[1:]) / 2).to(torch.uint8)
    packed = (q[::2] << 4) | q[1::2]
    offset = absmax.mean()
    code2 = dynamic_map()
    s2, absmax2 = blockwise(absmax - offset, code2, 256)
    qabsmax = torch.bucketize(s2, (code2[:-1] + code2[1:]) / 2).to(torch.uint8)
    return packed, qabsmax, absmax2, offset


def dequantize(packed, qabsmax, absmax2, offset, n):
    """dequantize_4bit in float32: the absmaxes back (code2[q] x absmax2, + offset), then
    code4[nibble] x absmax."""
    code4, code2 = torch.tensor(NF4, dtype=torch.float32), dynamic_map()
    am = (code2[qabsmax.long()].reshape(-1) * absmax2.repeat_interleave(256)[:qabsmax.numel()]) + offset
    nib = torch.stack([packed >> 4, packed & 0xF], dim=1).reshape(-1)[:n].long()
    return code4[nib] * am.repeat_interleave(64)[:n]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(here, "..", "golden"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(4127)
    # a weight-like tensor: normal, with a few outliers that set some blocks' absmax
    x = torch.randn(N, generator=g) * 0.02
    x[::997] *= 25.0
    code4 = torch.tensor(NF4, dtype=torch.float32)
    absmax = blockwise(x, code4, 64)[1]
    packed, qabsmax, absmax2, offset = quantize(x)
    code2 = dynamic_map()
    deq = dequantize(packed, qabsmax, absmax2, offset, N)
    golden = {"x": x, "code2": code2, "packed": packed.long(), "qabsmax": qabsmax.long(),
              "absmax2": absmax2, "offset": offset.reshape(1), "dequantized": deq,
              "code4": code4}
    folder = os.path.join(args.out, "nf4")
    os.makedirs(folder, exist_ok=True)
    L.st_write(os.path.join(folder, "golden.safetensors"), golden, META)
    err = (deq - x).abs().max().item()
    print("nf4", {"n": N, "blocks": absmax.numel(), "blocks2": absmax2.numel(), "max_abs_error": err})


if __name__ == "__main__":
    main()
