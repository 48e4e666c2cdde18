"""Write tests/golden/quant/q8_linear.bin: PyTorch's dynamic int8 Linear on small cases.

    /usr/bin/python3 tests/reference/make_quant_golden.py [--out tests/golden/quant]

Each case is an nn.Linear turned into nn.quantized.dynamic.Linear by
torch.ao.quantization.quantize_dynamic (default qconfig: weights per-tensor symmetric qint8 from
MinMaxObserver, activations quantised per call to quint8 with reduce_range), run on x. The file
keeps the inputs, the quantised weight PyTorch made and its scale, the activation's scale and
zero point PyTorch would choose, and the output. Deterministic (fixed seeds, one thread).

Layout, little-endian: int32 number of cases, then per case int32 M, K, N, has_bias; float32
x[M, K], w[N, K], bias[N] (when has_bias); int8 wq[N, K]; float32 w_scale, x_scale; int32 x_zp;
float32 y[M, N]; int32 engine (0 fbgemm, 1 onednn, 2 qnnpack, 3 x86: the quantized engine that
computed y).
"""
import argparse
import os
import struct

import numpy as np
import torch

ENGINES = {"fbgemm": 0, "onednn": 1, "qnnpack": 2, "x86": 3}


def choose_act_qparams(x):
    # PyTorch's quant_utils::ChooseQuantizationParams(min, max, 0, 255, reduce_range=True), the
    # same arithmetic in double as the C++ (kept here to record what the op used).
    mn, mx = float(np.float32(min(x.min().item(), 0.0))), float(np.float32(max(x.max().item(), 0.0)))
    qmin, qmax = 0, 127
    scale = (mx - mn) / (qmax - qmin)
    if np.float32(scale) == 0 or np.isinf(np.float32(1.0) / np.float32(scale)):
        scale = 0.1
    small = float(np.float32(6.1e-5))
    if scale < small:
        org = np.float32(scale)
        scale = small
        if mn == 0:
            mx = float(np.float32(small) * np.float32(qmax - qmin))
        elif mx == 0:
            mn = float(-np.float32(small) * np.float32(qmax - qmin))
        else:
            amp = np.float32(small) / org
            mn, mx = float(np.float32(mn) * amp), float(np.float32(mx) * amp)
    zmin, zmax = qmin - mn / scale, qmax - mx / scale
    emin, emax = abs(qmin) - abs(mn / scale), abs(qmax) - abs(mx / scale)
    z = zmin if emin < emax else zmax
    zp = qmin if z < qmin else qmax if z > qmax else int(np.rint(z))
    return float(np.float32(scale)), zp


def case(gen, M, K, N, bias, kind):
    x = torch.randn(M, K, generator=gen)
    if kind == "positive":
        x = x.abs()
    elif kind == "negative":
        x = -x.abs() - 0.5
    elif kind == "outlier":
        x[0, K // 2] = 40.0
    elif kind == "zero":
        x = torch.zeros(M, K)
    elif kind == "tiny":
        x = x * 1e-6
    lin = torch.nn.Linear(K, N, bias=bias)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(N, K, generator=gen) * 0.1)
        if bias:
            lin.bias.copy_(torch.randn(N, generator=gen))
    q = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(lin), {torch.nn.Linear}, dtype=torch.qint8)[0]
    with torch.no_grad():
        y = q(x)
    wq_t = q.weight()
    xs, xz = choose_act_qparams(x)
    out = struct.pack("<4i", M, K, N, int(bias))
    out += x.numpy().astype("<f4").tobytes() + lin.weight.detach().numpy().astype("<f4").tobytes()
    if bias:
        out += lin.bias.detach().numpy().astype("<f4").tobytes()
    out += wq_t.int_repr().numpy().astype("i1").tobytes()
    out += struct.pack("<ffi", wq_t.q_scale(), xs, xz)
    out += y.numpy().astype("<f4").tobytes()
    out += struct.pack("<i", ENGINES[torch.backends.quantized.engine])
    return out


CASES = [  # M, K, N, bias, kind
    (1, 576, 24, True, "normal"),
    (3, 17, 5, False, "normal"),
    (25, 64, 33, True, "positive"),
    (7, 130, 9, True, "negative"),
    (4, 96, 48, True, "outlier"),
    (2, 33, 7, True, "zero"),
    (5, 40, 11, False, "tiny"),
    (64, 96, 40, True, "normal"),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "golden", "quant"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(2024)
    blob = struct.pack("<i", len(CASES)) + b"".join(case(gen, *c) for c in CASES)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "q8_linear.bin"), "wb") as f:
        f.write(blob)
    print(f"wrote {len(blob)} bytes, {len(CASES)} cases, engine {torch.backends.quantized.engine}")


if __name__ == "__main__":
    main()
