"""Write the golden files under tests/golden/ from the PyTorch reference (llama_ref.py).

    /usr/bin/python3 tests/reference/make_golden.py [--out tests/golden]

Deterministic: fixed seeds, CPU float32; running it twice gives byte-identical files.
The script also checks the reference against itself (cached vs uncached generation, padded
batch vs solo prompts, argmax margins) and stops with an error if a check fails.
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref as L  # noqa: E402

BASE_CONFIG = {
    "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256,
    "max_position_embeddings": 128, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
}
# std 0.02 leaves attention almost uniform (q/k gradients ~100x below v's) and greedy decoding
# stuck on one token, so a RoPE, mask or cache bug would barely show: 0.1 makes them visible.
WEIGHT_STD = 0.1
NORM_NOISE = 0.1  # norm weights 1 + N(0, 0.1): a dropped or misapplied norm weight shows
N_NEW = 8
MIN_MARGIN = 1e-3  # every greedy argmax must win by this much, so float noise cannot flip it
CASES = [
    # name, overrides, seed, keys: "full" (all), "grads" (input_ids, loss, grad.*), "family"
    # (those and the greedy tokens), "rope" (those and the logits)
    ("tiny_tied", {"tie_word_embeddings": True}, 1001, "full"),
    ("tiny_untied", {"tie_word_embeddings": False}, 1002, "full"),
    ("tiny_mha", {"tie_word_embeddings": True, "num_key_value_heads": 4}, 1003, "grads"),
    # Qwen2: q, k, v biases; the second layer under a sliding window of 4 (max_window_layers 1);
    # pad_token_id one of the batch's ids (PAD_FROM_IDS), so that its embedding row gets no gradient
    ("tiny_qwen2", {"model_type": "qwen2", "tie_word_embeddings": False, "use_sliding_window": True,
                    "sliding_window": 4, "max_window_layers": 1, "pad_token_id": "PAD_FROM_IDS"}, 1004,
     "family"),
    # Qwen3: q_norm and k_norm, a head_dim that is not hidden / heads (4 x 24 = 96 != 64)
    ("tiny_qwen3", {"model_type": "qwen3", "tie_word_embeddings": True, "head_dim": 24}, 1005, "family"),
    # Mistral: every layer under a sliding window of 3 (the prompt is 7 tokens, 15 with the new)
    ("tiny_mistral", {"model_type": "mistral", "tie_word_embeddings": False, "sliding_window": 3}, 1006,
     "family"),
    # rope_scaling: each type transformers computes, on the tied model's shape
    ("tiny_rope_linear", {"rope_scaling": {"rope_type": "linear", "factor": 4.0}}, 1007, "rope"),
    ("tiny_rope_dynamic", {"rope_scaling": {"type": "dynamic", "factor": 2.0}}, 1008, "rope"),
    ("tiny_rope_llama3", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                           "high_freq_factor": 4.0, "original_max_position_embeddings": 32}},
     1009, "rope"),
    ("tiny_rope_yarn", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, 1010, "rope"),
    ("tiny_rope_yarn_orig", {"rope_scaling": {"rope_type": "yarn", "factor": 2.0, "beta_fast": 16.0,
                                              "original_max_position_embeddings": 32}}, 1011, "rope"),
    # Mixtral: every layer sparse, 4 experts of intermediate_size, 2 a token (renormalised); the
    # load-balancing loss on (output_router_logits), so that it reaches the routers
    ("tiny_mixtral", {"model_type": "mixtral", "tie_word_embeddings": False, "intermediate_size": 96,
                      "num_local_experts": 4, "num_experts_per_tok": 2, "output_router_logits": True,
                      "router_aux_loss_coef": 0.05}, 1012, "family"),
    # Qwen2MoE: layer 0 dense (decoder_sparse_step 2), layer 1 sparse with a gated shared expert;
    # the top-k weights not renormalised
    ("tiny_qwen2_moe", {"model_type": "qwen2_moe", "tie_word_embeddings": False, "num_experts": 4,
                        "num_experts_per_tok": 2, "moe_intermediate_size": 48, "shared_expert_intermediate_size": 80,
                        "norm_topk_prob": False, "decoder_sparse_step": 2}, 1013, "family"),
    # Qwen3MoE: q_norm and k_norm, 8 experts of 32, 2 a token renormalised; layer 0 dense
    # (mlp_only_layers), tied
    ("tiny_qwen3_moe", {"model_type": "qwen3_moe", "tie_word_embeddings": True, "head_dim": 24, "num_experts": 8,
                        "num_experts_per_tok": 2, "moe_intermediate_size": 32, "norm_topk_prob": True,
                        "mlp_only_layers": [0]}, 1014, "family"),
]
# Every router's k-th and (k+1)-th probabilities must differ by this much, so that float noise in
# another implementation cannot change which experts a token goes to.
MIN_ROUTE_GAP = 1e-4
META = {"format": "pt", "generator": "tests/reference/make_golden.py"}


def fail(msg):
    raise SystemExit("make_golden: " + msg)


def fresh(params, dtype=torch.float32):
    return {n: t.detach().clone().to(dtype).requires_grad_(True) for n, t in params.items()}


def loss_and_grads(cfg, params, ids):
    params = fresh(params)
    loss = L.loss_fn(cfg, params, ids)
    loss.backward()
    # a parameter the graph never reached has no .grad: its gradient is zero
    return loss.detach(), {n: torch.zeros_like(t) if t.grad is None else t.grad.detach().clone()
                           for n, t in params.items()}


def train_two_steps(cfg, params, ids, make_opt):
    """forward, backward, step, zero_grad(set_to_none=True), twice on the same batch."""
    params = fresh(params)
    opt = make_opt(list(params.values()))
    losses = []
    for _ in range(2):
        loss = L.loss_fn(cfg, params, ids)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return torch.tensor(losses), {n: t.detach().clone() for n, t in params.items()}


OPTIMIZERS = {
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-3),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.01),
    "sgdm": lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9),
}


def generate_checked(cfg, params, prompt, mask=None):
    """Greedy tokens with the cache, checked equal to the uncached ones and safely argmaxed."""
    cached, margins = L.greedy_generate(cfg, params, prompt, N_NEW, mask, use_cache=True,
                                        return_margins=True)
    uncached = L.greedy_generate(cfg, params, prompt, N_NEW, mask, use_cache=False)
    if not torch.equal(cached, uncached):
        fail("cached and uncached greedy tokens differ: %s vs %s"
             % (cached.tolist(), uncached.tolist()))
    if margins.min().item() < MIN_MARGIN:
        fail("greedy argmax margin %.2e below %.0e" % (margins.min().item(), MIN_MARGIN))
    return cached, margins.min().item()


def grad_health(grads):
    """Smallest nonzero |grad| relative to its tensor's largest, over all tensors: how close
    an Adam first step (about lr * sign(grad)) comes to a sign that float noise could flip."""
    worst = 1.0
    for g in grads.values():
        nz = g.abs()[g != 0]
        if nz.numel():
            worst = min(worst, (nz.min() / nz.max()).item())
    return worst


def greedy_keys(cfg, params, ids, name):
    """greedy (solo prompt) and the left-padded batch, checked against each row alone."""
    greedy, m1 = generate_checked(cfg, params, ids[:1])
    solo2, m2 = generate_checked(cfg, params, ids[1:2, :4])
    prompt_b, mask_b = L.left_pad([ids[0], ids[1, :4]], pad_id=0)
    batch, m3 = generate_checked(cfg, params, prompt_b, mask_b)
    if not torch.equal(batch[0], greedy[0]) or not torch.equal(batch[1], solo2[0]):
        fail("%s: padded batch greedy %s differs from solo prompts %s, %s"
             % (name, batch.tolist(), greedy.tolist(), solo2.tolist()))
    keys = {"greedy": greedy, "greedy_batch": batch, "prompt_batch": prompt_b, "mask_batch": mask_b}
    info = {"greedy": greedy.tolist(), "greedy_batch": batch.tolist(), "min_margin": min(m1, m2, m3)}
    return keys, info


def route_gap(cfg, params, ids):
    """The smallest gap between the k-th and (k+1)-th router probability of any token of any
    sparse layer, over the loss's forward and every greedy forward (1 without experts)."""
    if not any(cfg.sparse_layers):
        return 1.0
    L.ROUTER_PROBS.clear()
    L.KEEP_ROUTER_PROBS = True
    with torch.no_grad():
        L.forward(cfg, fresh(params), ids)
        prompt_b, mask_b = L.left_pad([ids[0], ids[1, :4]], pad_id=0)
        for prompt, mask in ((ids[:1], None), (ids[1:2, :4], None), (prompt_b, mask_b)):
            L.greedy_generate(cfg, params, prompt, N_NEW, mask, use_cache=True)
            L.greedy_generate(cfg, params, prompt, N_NEW, mask, use_cache=False)
    L.KEEP_ROUTER_PROBS = False
    k = cfg.num_experts_per_tok
    gap = min((p.sort(dim=-1, descending=True).values[:, k - 1] - p.sort(dim=-1, descending=True).values[:, k])
              .min().item() for p in L.ROUTER_PROBS)
    L.ROUTER_PROBS.clear()
    return gap


def make_case(out_dir, name, overrides, seed, level):
    full = level == "full"
    cfg_dict = dict(BASE_CONFIG, **overrides)
    g = torch.Generator().manual_seed(seed + 500)
    ids = torch.randint(1, cfg_dict["vocab_size"], (2, 7), generator=g, dtype=torch.int64)
    if cfg_dict.get("pad_token_id") == "PAD_FROM_IDS":
        cfg_dict["pad_token_id"] = int(ids[0, 2])
    cfg = L.LlamaConfig(cfg_dict)
    params = L.init_params(cfg, seed, std=WEIGHT_STD, norm_noise=NORM_NOISE)
    gap = route_gap(cfg, params, ids)
    if gap < MIN_ROUTE_GAP:
        fail("%s: two router probabilities lie %.1e apart at the top-k boundary (seed %d): pick another seed"
             % (name, gap, seed))

    folder = os.path.join(out_dir, name)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg.to_dict(), f, indent=2)
        f.write("\n")
    weights = {n: t.detach() for n, t in params.items()}
    L.st_write(os.path.join(folder, "model.safetensors"), weights, META)

    golden = {"input_ids": ids}
    loss, grads = loss_and_grads(cfg, params, ids)
    golden["loss"] = loss.reshape(1)
    golden.update({"grad." + n: g for n, g in grads.items()})
    info = {"loss": loss.item(), "min_rel_grad": grad_health(grads)}
    if any(cfg.sparse_layers):
        info["min_route_gap"] = gap
        # an expert no token reached has no gradient: the case should reach most of them
        info["experts_without_gradient"] = sum(1 for n, t in grads.items() if ".experts." in n and not t.any())
    if cfg.pad_token_id is not None:  # the padding row gets nothing, though the batch holds it
        if grads["model.embed_tokens.weight"][cfg.pad_token_id].abs().max().item() != 0.0:
            fail("%s: the embedding row of pad_token_id %d has a gradient" % (name, cfg.pad_token_id))
        info["pad_token_id"] = cfg.pad_token_id

    if full:
        bf16 = {n: t.to(torch.bfloat16) for n, t in weights.items()}
        L.st_write(os.path.join(folder, "model_bf16.safetensors"), bf16, META)
        loss_b, grads_b = loss_and_grads(cfg, bf16, ids)  # fresh() casts back to float32
        golden["loss_bf16"] = loss_b.reshape(1)
        golden.update({"grad_bf16." + n: g for n, g in grads_b.items()})
        info["loss_bf16"] = loss_b.item()

        for opt_name, make_opt in OPTIMIZERS.items():
            losses, after = train_two_steps(cfg, params, ids, make_opt)
            golden[opt_name + "_losses"] = losses.float()
            golden.update({opt_name + "." + n: t for n, t in after.items()})

    if level in ("full", "family"):
        keys, more = greedy_keys(cfg, params, ids, name)
        golden.update(keys)
        info.update(more)
    if level == "rope":
        with torch.no_grad():
            golden["logits"] = L.forward(cfg, fresh(params), ids).detach()
        plain = L.LlamaConfig(dict(cfg_dict, rope_scaling=None))
        with torch.no_grad():
            moved = (L.forward(plain, fresh(params), ids) - golden["logits"]).abs().max().item()
        # dynamic is the default up to max_position_embeddings (transformers grows the base only
        # past them); every other type must move the logits, or the test would prove nothing
        dynamic = (cfg.rope_scaling.get("rope_type") or cfg.rope_scaling.get("type")) == "dynamic"
        if (moved != 0.0) if dynamic else (moved < 1e-3):
            fail("%s: the rope scaling moves the logits by %.1e" % (name, moved))
        info["logits_moved_by_scaling"] = moved

    L.st_write(os.path.join(folder, "golden.safetensors"), golden, META)
    return info


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(here, "..", "golden"))
    args = ap.parse_args()
    torch.set_num_threads(1)  # one thread: same summation order on every machine
    for name, overrides, seed, level in CASES:
        info = make_case(args.out, name, overrides, seed, level)
        print(name, json.dumps(info))


if __name__ == "__main__":
    main()
