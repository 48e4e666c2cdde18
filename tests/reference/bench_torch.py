"""PyTorch side of the benchmarks: the same model and runs as membill's, timed in PyTorch.

    OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 tests/reference/bench_torch.py --mode train --steps 3
    OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 tests/reference/bench_torch.py --mode generate
    OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 tests/reference/bench_torch.py --mode generate --int8

--int8: every linear as quantize_dynamic makes it (nn.quantized.dynamic.Linear's
torch.ops.quantized.linear_dynamic, reduce_range, on the build's default engine).

Prints one JSON object on stdout. Model: SmolLM2-135M's shape unless --config names an HF
config.json; random init (normal, std 0.02; norms 1), seeded. Uses llama_ref.py's model.
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref as L  # noqa: E402

SMOLLM2_135M = {
    "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
    "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152,
    "max_position_embeddings": 8192, "rope_theta": 100000.0, "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
}


def peak_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def random_ids(cfg, shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.vocab_size, shape, generator=g, dtype=torch.int64)


def bench_train(cfg, params, args):
    ids = random_ids(cfg, (args.batch, args.seq_len), args.seed + 1)
    opt = torch.optim.Adam(list(params.values()), lr=args.lr)
    steps = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        loss = L.loss_fn(cfg, params, ids)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        steps.append({"loss": loss.item(), "forward_s": t1 - t0, "backward_s": t2 - t1,
                      "optimizer_s": t3 - t2, "step_s": t3 - t0,
                      "peak_rss_bytes": peak_rss_bytes()})
    steady = steps[1:] if len(steps) >= 2 else steps
    timing = {k: statistics.median(s[k] for s in steady)
              for k in ("forward_s", "backward_s", "optimizer_s", "step_s")}
    timing["steps"] = steps
    return {"run": {"kind": "train", "batch": args.batch, "seq_len": args.seq_len,
                    "optimizer": "adam", "lr": args.lr, "steps": args.steps},
            "loss": steps[-1]["loss"], "timing": timing}


@torch.no_grad()
def timed_greedy(cfg, params, prompt, n_new, use_cache):
    """Greedy decode like llama_ref.greedy_generate, timing prefill and each decode step.
    Without the cache every step recomputes the whole sequence."""
    cache = L.new_cache(cfg) if use_cache else None
    seq, step_s, out = prompt, [], []
    t0 = time.perf_counter()
    logits = L.forward(cfg, params, prompt, cache=cache)
    prefill_s = time.perf_counter() - t0
    for i in range(n_new):
        nxt = logits[:, -1].argmax(-1)
        out.append(nxt)
        seq = torch.cat((seq, nxt[:, None]), dim=1)
        if i == n_new - 1:
            break
        t = time.perf_counter()
        logits = L.forward(cfg, params, nxt[:, None] if use_cache else seq, cache=cache)
        step_s.append(time.perf_counter() - t)
    total = time.perf_counter() - t0
    return torch.stack(out, 1), {"prefill_s": prefill_s, "decode_s": sum(step_s),
                                 "generate_s": total,
                                 "decode_step_s": statistics.median(step_s) if step_s else 0.0,
                                 "tokens_per_s": prompt.shape[0] * n_new / total}


def bench_generate(cfg, params, args):
    prompt = random_ids(cfg, (1, args.seq_len), args.seed + 1)
    timed_greedy(cfg, params, prompt[:, :4], 2, True)  # warm up allocator and threads
    tok_c, cached = timed_greedy(cfg, params, prompt, args.new_tokens, True)
    tok_u, uncached = timed_greedy(cfg, params, prompt, args.new_tokens, False)
    if not torch.equal(tok_c, tok_u):
        raise SystemExit("bench_torch: cached and uncached greedy tokens differ")

    prompts = random_ids(cfg, (args.batch_prompts, args.seq_len), args.seed + 2)
    t0 = time.perf_counter()
    one_by_one = [timed_greedy(cfg, params, prompts[r:r + 1], args.batch_new_tokens, True)[0]
                  for r in range(args.batch_prompts)]
    sequential_s = time.perf_counter() - t0
    tok_b, batched = timed_greedy(cfg, params, prompts, args.batch_new_tokens, True)
    same = all(torch.equal(tok_b[r], one_by_one[r][0]) for r in range(args.batch_prompts))
    return {"run": {"kind": "infer", "seq_len": args.seq_len, "new_tokens": args.new_tokens,
                    "batch_prompts": args.batch_prompts,
                    "batch_new_tokens": args.batch_new_tokens},
            "generated": tok_c[0].tolist(),
            "timing": {"cached": cached, "uncached": uncached,
                       "cache_speedup": uncached["generate_s"] / cached["generate_s"],
                       "sequential_s": sequential_s, "batched_s": batched["generate_s"],
                       "batched": batched,
                       "batch_speedup": sequential_s / batched["generate_s"],
                       "batch_rows_equal_sequential": same},
            "peak_rss_bytes": peak_rss_bytes()}


def use_int8_linears():
    """F.linear of llama_ref as quantize_dynamic's int8 Linear, weights packed once."""
    packed = {}
    real = L.F.linear

    def qlinear(x, w, b=None):
        if w.dim() != 2:
            return real(x, w, b)
        key = id(w)
        if key not in packed:
            obs = torch.ao.quantization.MinMaxObserver(dtype=torch.qint8, qscheme=torch.per_tensor_symmetric)
            obs(w)
            scale, zp = obs.calculate_qparams()
            q = torch.quantize_per_tensor(w, float(scale), int(zp), torch.qint8)
            packed[key] = torch.ops.quantized.linear_prepack(q, b)
        shape = x.shape
        y = torch.ops.quantized.linear_dynamic(x.reshape(-1, shape[-1]).contiguous(), packed[key], True)
        return y.reshape(*shape[:-1], y.shape[-1])

    L.F.linear = qlinear


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("train", "generate"), default="train")
    ap.add_argument("--config", help="an HF config.json (default: SmolLM2-135M's shape)")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--seq-len", type=int, default=25)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--new-tokens", type=int, default=40)
    ap.add_argument("--batch-prompts", type=int, default=8)
    ap.add_argument("--batch-new-tokens", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--int8", action="store_true", help="generate with quantize_dynamic's int8 linears")
    args = ap.parse_args()
    if args.steps < 1 or args.seq_len < 2 or args.new_tokens < 1 or args.batch < 1:
        ap.error("--steps, --batch, --new-tokens must be >= 1 and --seq-len >= 2")
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    cfg = L.LlamaConfig.from_json(args.config) if args.config else L.LlamaConfig(SMOLLM2_135M)
    t0 = time.perf_counter()
    params = L.init_params(cfg, args.seed, std=0.02)
    init_s = time.perf_counter() - t0
    if args.mode == "generate":
        for t in params.values():
            t.requires_grad_(False)
    if args.int8:
        if args.mode != "generate":
            ap.error("--int8 is a generation setting")
        use_int8_linears()
    n_params = sum(t.numel() for t in params.values())
    report = {"engine": "pytorch " + torch.__version__ + (" int8 dynamic" if args.int8 else ""),
              "model": {"name": os.path.basename(args.config) if args.config else "smollm2-135m",
                        "parameters": n_params, "layers": cfg.num_hidden_layers,
                        "hidden": cfg.hidden_size},
              "threads": torch.get_num_threads(), "init_s": init_s}
    if args.mode == "train":
        report.update(bench_train(cfg, params, args))
    else:
        report.update(bench_generate(cfg, params, args))
    report["process"] = {"peak_rss_bytes": peak_rss_bytes()}
    json.dump(report, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
