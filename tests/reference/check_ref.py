"""Checks of the PyTorch reference against itself and an independent naive implementation.

    /usr/bin/python3 tests/reference/check_ref.py

1. gradcheck of the whole model's loss in float64 (GQA tied, MHA untied), every parameter;
2. the vectorized forward against a per-token, per-head loop written from the HF formulas;
3. the loss against an explicit sum of -log softmax over shifted labels;
4. cached logits against uncached ones, and a left-padded batch against its prompts run alone;
5. safetensors round trip (F32, F16, BF16, I64) and BF16 rounding against round-to-nearest-even
   on the raw bits; the committed golden files reload and reproduce their loss and gradients;
6. how strongly the golden loss and gradients react to typical bugs (each must move them far
   beyond float32 noise, or the golden files could not catch it).
Exits 1 on the first failed check.
"""
import math
import os
import sys
import tempfile

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import llama_ref as L  # noqa: E402
import make_golden as M  # noqa: E402

ORIG_ROPE_COS_SIN = L.rope_cos_sin
ORIG_RMS_NORM = L.rms_norm
ORIG_ATTENTION = L.attention
GOLDEN = os.path.join(HERE, "..", "golden")
SMALL = {"hidden_size": 8, "intermediate_size": 12, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 4, "vocab_size": 11,
         "max_position_embeddings": 32, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
         "tie_word_embeddings": True}


def check(ok, what):
    print(("PASS " if ok else "FAIL ") + what)
    if not ok:
        sys.exit(1)


def rel_err(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30)).item()


# --- 1. gradcheck --------------------------------------------------------------------------------

def gradcheck_model(overrides):
    cfg = L.LlamaConfig(dict(SMALL, **overrides))
    params = L.init_params(cfg, 5, std=0.3, norm_noise=0.2, dtype=torch.float64)
    ids = torch.randint(0, cfg.vocab_size, (2, 5), generator=torch.Generator().manual_seed(6))
    names = list(params)

    def fn(*tensors):
        return L.loss_fn(cfg, dict(zip(names, tensors)), ids)
    return torch.autograd.gradcheck(fn, tuple(params.values()), eps=1e-6, atol=1e-7, rtol=1e-5)


# --- 2. naive forward ----------------------------------------------------------------------------

def naive_logits(cfg, params, ids):
    """One token and one head at a time, in float64, straight from the HF formulas."""
    p = {n: t.detach().double() for n, t in params.items()}
    nh, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    half = hd // 2

    def norm(x, w):
        return x / math.sqrt(float((x * x).mean()) + cfg.rms_norm_eps) * w

    def rope(vec, pos):
        out = vec.clone()
        for i in range(half):
            ang = pos / (cfg.rope_theta ** (2 * i / hd))
            a, b = vec[i].item(), vec[i + half].item()
            out[i] = a * math.cos(ang) - b * math.sin(ang)
            out[i + half] = b * math.cos(ang) + a * math.sin(ang)
        return out

    head = p["model.embed_tokens.weight"] if cfg.tie_word_embeddings else p["lm_head.weight"]
    rows = []
    for b in range(ids.shape[0]):
        xs = [p["model.embed_tokens.weight"][int(t)].clone() for t in ids[b]]
        for layer in range(cfg.num_hidden_layers):
            pre = "model.layers.%d." % layer
            hn = [norm(x, p[pre + "input_layernorm.weight"]) for x in xs]
            qs = [p[pre + "self_attn.q_proj.weight"] @ h for h in hn]
            ks = [p[pre + "self_attn.k_proj.weight"] @ h for h in hn]
            vs = [p[pre + "self_attn.v_proj.weight"] @ h for h in hn]
            new_xs = []
            for t in range(len(xs)):
                heads = []
                for h in range(nh):
                    g = h // (nh // nkv)
                    q = rope(qs[t][h * hd:(h + 1) * hd], t)
                    scores = [float(q @ rope(ks[j][g * hd:(g + 1) * hd], j)) / math.sqrt(hd)
                              for j in range(t + 1)]
                    mx = max(scores)
                    w = [math.exp(s - mx) for s in scores]
                    out = sum(w[j] / sum(w) * vs[j][g * hd:(g + 1) * hd] for j in range(t + 1))
                    heads.append(out)
                x = xs[t] + p[pre + "self_attn.o_proj.weight"] @ torch.cat(heads)
                h2 = norm(x, p[pre + "post_attention_layernorm.weight"])
                gate = p[pre + "mlp.gate_proj.weight"] @ h2
                up = p[pre + "mlp.up_proj.weight"] @ h2
                x = x + p[pre + "mlp.down_proj.weight"] @ (gate / (1 + torch.exp(-gate)) * up)
                new_xs.append(x)
            xs = new_xs
        rows.append(torch.stack([head @ norm(x, p["model.norm.weight"]) for x in xs]))
    return torch.stack(rows)


def naive_loss(logits, ids):
    total, n = 0.0, 0
    for b in range(ids.shape[0]):
        for t in range(ids.shape[1] - 1):
            row = logits[b, t].double()
            lse = math.log(sum(math.exp(v) for v in row.tolist()))
            total += lse - row[int(ids[b, t + 1])].item()
            n += 1
    return total / n


# --- 6. bug sensitivity --------------------------------------------------------------------------

def _rope_interleaved(x, cos, sin):
    # GPT-J pairing (2i, 2i+1) instead of HF's (i, i + hd/2)
    hd = x.shape[-1]
    c = cos[:, None, :, : hd // 2].repeat_interleave(2, -1)
    s = sin[:, None, :, : hd // 2].repeat_interleave(2, -1)
    rot = torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)
    return x * c + rot * s


def _repeat_kv_tiled(x, n_rep):
    # query head h reading kv head h % KV instead of h // n_rep
    return x if n_rep == 1 else x.repeat(1, n_rep, 1, 1)


def _no_causal(attention_mask, q_len, kv_len, window=0):
    return torch.ones(1, 1, q_len, kv_len, dtype=torch.bool)


def _scale_by_hd(q, k, v, allowed):
    return ORIG_ATTENTION(q * (1.0 / math.sqrt(q.shape[-1])), k, v, allowed)


def _eps_outside(x, weight, eps):
    return weight * (x / (x.pow(2).mean(-1, keepdim=True).sqrt() + eps))


def _theta_default(cfg, position_ids, dtype):
    saved = cfg.rope_theta
    cfg.rope_theta = 500000.0
    try:
        return ORIG_ROPE_COS_SIN(cfg, position_ids, dtype)
    finally:
        cfg.rope_theta = saved


MUTATIONS = [
    ("rope interleaved pairs", "apply_rope", _rope_interleaved),
    ("no rope", "apply_rope", lambda x, c, s: x),
    ("rope theta 500000", "rope_cos_sin", _theta_default),
    ("kv head h % KV (tiled)", "repeat_kv", _repeat_kv_tiled),
    ("no causal mask", "attention_mask_4d", _no_causal),
    ("scale 1/hd", "attention", _scale_by_hd),
    ("norm weight ignored", "rms_norm", lambda x, w, eps: ORIG_RMS_NORM(x, 1.0, eps)),
    ("eps outside sqrt (subtle)", "rms_norm", _eps_outside),
    ("gelu for silu", "swiglu_mlp",
     lambda x, g, u, d, gb=None, ub=None, db=None: F.linear(F.gelu(F.linear(x, g, gb)) * F.linear(x, u, ub), d,
                                                          db)),
]


def sensitivity(case):
    cfg = L.LlamaConfig.from_json(os.path.join(GOLDEN, case, "config.json"))
    gold = L.st_read(os.path.join(GOLDEN, case, "golden.safetensors"))
    weights = L.st_read(os.path.join(GOLDEN, case, "model.safetensors"))
    ids = gold["input_ids"]
    worst_ok = math.inf
    print("  %-26s %12s %12s" % ("bug", "loss rel", "grad rel"))
    for label, fn_name, repl in MUTATIONS:
        original = getattr(L, fn_name)
        setattr(L, fn_name, repl)
        try:
            loss, grads = M.loss_and_grads(cfg, weights, ids)
        finally:
            setattr(L, fn_name, original)
        lrel = abs(loss.item() - gold["loss"].item()) / gold["loss"].item()
        grel = max(rel_err(grads[n], gold["grad." + n]) for n in grads)
        if "subtle" not in label:
            worst_ok = min(worst_ok, grel)
        print("  %-26s %12.2e %12.2e" % (label, lrel, grel))
    return worst_ok


def main():
    torch.set_num_threads(1)

    for ov in ({}, {"tie_word_embeddings": False, "num_key_value_heads": 4}):
        check(gradcheck_model(ov), "float64 gradcheck of the whole loss %s" % (ov or "(GQA, tied)"))

    for ov in ({}, {"tie_word_embeddings": False}, {"num_key_value_heads": 1}):
        cfg = L.LlamaConfig(dict(SMALL, **ov))
        params = L.init_params(cfg, 8, std=0.4, norm_noise=0.2, dtype=torch.float64)
        ids = torch.randint(0, cfg.vocab_size, (2, 6), generator=torch.Generator().manual_seed(9))
        logits = L.forward(cfg, params, ids)
        naive = naive_logits(cfg, params, ids)
        # RoPE angles are float32 in HF (and here) even for a float64 model, hence 1e-6
        check(rel_err(logits, naive) < 1e-6, "forward equals the naive loop %s (rel %.1e)"
              % (ov, rel_err(logits, naive)))
        loss = L.causal_lm_loss(logits, ids).item()
        check(abs(loss - naive_loss(logits, ids)) < 1e-12, "loss equals the explicit shifted NLL")

    cfg = L.LlamaConfig.from_json(os.path.join(GOLDEN, "tiny_tied", "config.json"))
    params = L.init_params(cfg, 3, std=0.1, norm_noise=0.1)
    ids = torch.randint(1, cfg.vocab_size, (2, 9), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full = L.forward(cfg, params, ids)
        cache = L.new_cache(cfg)
        parts = [L.forward(cfg, params, ids[:, :5], cache=cache)]
        parts += [L.forward(cfg, params, ids[:, t:t + 1], cache=cache) for t in range(5, 9)]
        check(rel_err(torch.cat(parts, 1), full) < 1e-5, "prefill + cached steps = full forward")
        check(tuple(cache[0][0].shape) == (2, 2, 9, 16), "cache holds [B, KV, S, hd] keys")
        solo = L.forward(cfg, params, ids[1:2, :4])
        padded, mask = L.left_pad([ids[0, :9], ids[1, :4]])
        batch = L.forward(cfg, params, padded, mask, L.padded_positions(mask))
        check(rel_err(batch[1, 5:], solo[0]) < 1e-5 and rel_err(batch[0], full[0]) < 1e-5,
              "left-padded batch rows = prompts alone")
        a = L.greedy_generate(cfg, params, padded, 6, mask, use_cache=True)
        b = L.greedy_generate(cfg, params, padded, 6, mask, use_cache=False)
        check(torch.equal(a, b), "cached = uncached greedy tokens on a padded batch")

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "t.safetensors")
        g = torch.Generator().manual_seed(1)
        ts = {"a": torch.randn(3, 4, generator=g), "b": torch.randn(5, generator=g).half(),
              "c": torch.randn(2, 3, generator=g).bfloat16(), "d": torch.arange(-3, 4),
              "e": torch.zeros(0, 2)}
        L.st_write(path, ts, {"k": "v"})
        back, meta = L.st_read(path, with_metadata=True)
        check(meta == {"k": "v"} and all(back[k].dtype == t.dtype and torch.equal(back[k], t)
                                         for k, t in ts.items()), "safetensors round trip")
        with open(path, "rb") as f:
            hlen = int.from_bytes(f.read(8), "little")
        check(hlen % 8 == 0, "safetensors header padded to 8 bytes")

    x = torch.randn(100000, generator=torch.Generator().manual_seed(2)) * 3
    bits = x.view(torch.int32).long() & 0xFFFFFFFF
    rne = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF
    check(torch.equal(x.bfloat16().view(torch.int16).long() & 0xFFFF, rne),
          "BF16 cast = round to nearest even on the bits")

    for case, _, _, full in M.CASES:
        folder = os.path.join(GOLDEN, case)
        cfg, params = L.load_model(folder)
        gold = L.st_read(os.path.join(folder, "golden.safetensors"))
        loss, grads = M.loss_and_grads(cfg, params, gold["input_ids"])
        same = torch.equal(loss.reshape(1), gold["loss"]) and all(
            torch.equal(grads[n], gold["grad." + n]) for n in grads)
        check(same, "%s: golden loss and grads reproduce from the files" % case)
        if full:
            _, p16 = L.load_model(os.path.join(folder, "model_bf16.safetensors"),
                                  os.path.join(folder, "config.json"))
            check(all(torch.equal(p16[n], params[n].bfloat16().float()) for n in params),
                  "%s: model_bf16 = model rounded to BF16" % case)

    print("bug sensitivity on tiny_tied (max over tensors of max|dgrad| / max|grad|):")
    worst = sensitivity("tiny_tied")
    check(worst > 1e-3, "every listed bug moves some gradient by > 1e-3 relative")


if __name__ == "__main__":
    main()
