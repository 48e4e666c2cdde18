"""Golden memory figures of a PyTorch 1.13 + transformers-style training step, from PyTorch's
own profiler.

    /usr/bin/python3 tests/reference/profile_step.py --out tests/golden/pytorch [--only NAME]

Runs two training steps of LlamaForCausalLM (hf_llama.py: transformers' eager op sequence) per
configuration under torch.profiler.profile(activities=[CPU], profile_memory=True,
record_shapes=True), each configuration in a fresh process, and writes
<out>/<config-name>.json. --list prints the configuration names.

What is measured. With profile_memory=True, PyTorch 1.13's CPU allocator reports every
allocation and every free of a block it handed out while profiling as a "[memory]" event: the
block's address, its size in bytes (negative for a free) and the running total of the bytes
allocated while profiling and not yet freed. kineto_results.experimental_event_tree() gives
these events nested under the op that made them (record_function ranges, autograd nodes, aten
ops). The live-bytes curve is baseline + that running total (checked: each event's total is
the previous one plus its size). The weights exist before profiling starts and are never freed,
so they are the baseline. The record_function ranges this script adds (phases, module scopes)
cost 1.13 a 4-byte handle and a 288-byte block each; those are taken out of the curve (the
ranges torch.optim opens itself stay: a real step has them too).

The step (the loop of transformers' Trainer, which drops the model output inside compute_loss):

    for step in (1, 2):
        optimizer.zero_grad(set_to_none=True)      # phase "zero_grad"
        out = model(input_ids=ids, labels=ids)     # phase "forward" (use_cache=True: the output
        loss = out.loss; del out                   #  holds logits and a DynamicCache) ...
                                                   #  ... dropped before the phase ends
        loss.backward()                            # phase "backward"
        optimizer.step()                           # phase "optimizer"
        del loss

(under torch.autocast("cpu", dtype=torch.bfloat16) for the forward phase when autocast is on).
Model in train mode, Adam(lr=1e-5, betas (0.9, 0.999), eps 1e-8), 2 threads.

Schema of <config-name>.json (all sizes in bytes):
{
  "schema": "membill-pytorch-step/1",
  "config": {"name", "model": {HF config fields}, "batch", "seq_len",
             "dtype": "float32" | "bfloat16"   (the parameters' dtype),
             "autocast": null | "bfloat16"     (torch.autocast("cpu") around the forward),
             "adam": "for-loop" | "foreach"    (Adam(foreach=False | True)),
             "lr", "threads", "seed"},
  "torch_version": "1.13.1",
  "baseline_bytes":  bytes of the parameters (tied embedding counted once), live before step 1
                     and never freed; every *_bytes figure named "live" or "peak" below is
                     absolute: it includes this baseline,
  "inputs_bytes":    the input ids [batch, seq_len] int64, made after the baseline (while
                     profiling, before step 1): included in every live and peak figure,
  "untracked_bytes": other tensors that exist before profiling and are in no figure (the rope
                     inv_freq buffer),
  "steps": [{
      "step": 1 | 2, "loss": float,
      "phases": [{"name": "zero_grad" | "forward" | "backward" | "optimizer",
                  "start_live_bytes", "peak_bytes", "end_live_bytes",
                  "peak_op":  the op whose allocation made the phase's peak (scope > node > op),
                  "peak_alloc_bytes": the size of that allocation,
                  "allocated_bytes", "allocations": sum and count of the phase's allocations}],
      "peak_bytes", "peak_phase", "peak_op": the step's highest live total and where it was,
      "live_after_forward_bytes": live at the end of the forward phase (output dropped),
      "output_bytes": what the dropped output held alone (logits + DynamicCache), i.e. the
                      live total just before `del out` minus live_after_forward_bytes,
      "saved_after_forward_bytes": blocks allocated by the forward and still live at its end,
      "saved_by_role": {role: bytes} of those blocks, by the module range that allocated them,
      "held_by_output_by_role": {role: bytes}: the blocks the output alone kept ("logits",
                      "cache" = the DynamicCache's key/value tensors),
      "saved_by_op": {role: [{"op", "bytes", "count"}]}: the saved blocks by role, op and size,
      "live_at_peak": {what: bytes}: blocks live at the step's peak by where they came from
                      ("weights", "inputs", "grads", "adam_state", "forward:<role>",
                      "step<N>/<phase> temporary" for anything else)
  }],
  "peak_bytes", "peak_phase": the highest of both steps,
  "saved_after_forward_bytes": step 1's live_after_forward_bytes - baseline_bytes,
  "saved_by_role": step 1's saved_by_role,
  "top_allocations": {"step1" | "step2": {phase: [up to 20 largest allocations of the phase:
      {"bytes", "op", "node", "scope", "shapes", "dtypes", "freed_in"}]}}
}
Roles: embed, mask (causal mask), rope_cos_sin (rotary cos/sin), norm (RMSNorm), attn_qkv
(q/k/v projections), attn_rope (rotary on q, k), attn_repeat_kv, attn_probs (scores, mask add,
softmax, dropout), attn_context (probs @ v, transpose), attn_o_proj, residual, mlp, final_norm,
logits, loss, cache, autocast_weight_cast (autocast's bf16 copies of weights), other. In an
allocation record, "op" is the path of aten ops that made the block ("aten::linear >
aten::matmul > aten::mm"; a cast names what it casts: "... > aten::_to_copy of float[576,
576]"), "node" the autograd node (backward) or optimizer range, "scope" the module range,
"shapes"/"dtypes" the outermost op's inputs, "freed_in" the phase that freed the block
("step<N>/<phase>", or "live" if it outlived the run).
"""
import argparse
import bisect
import collections
import contextlib
import gc
import json
import os
import subprocess
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_llama as H  # noqa: E402
import llama_ref as L  # noqa: E402

SMOLLM2_135M = {
    "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
    "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152,
    "max_position_embeddings": 8192, "rope_theta": 100000.0, "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
}
QWEN3_135M = dict(SMOLLM2_135M, model_type="qwen3", attention_bias=True)
# A small untied Llama: the head layouts SmolLM2 does not have, whose per-layer figures a 135M
# model's bill would hide.
TINY = {
    "model_type": "llama", "hidden_size": 256, "intermediate_size": 640, "num_hidden_layers": 4,
    "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 8192,
    "max_position_embeddings": 2048, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
}
TINY_MHA = dict(TINY, num_key_value_heads=8)
TINY_MQA = dict(TINY, num_key_value_heads=1)
# A small Mixtral: 4 sparse layers of 8 experts, 2 a token (its router, its experts' eager loop)
MIXTRAL_TINY = {
    "model_type": "mixtral", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 32, "vocab_size": 4096,
    "max_position_embeddings": 1024, "rope_theta": 1000000.0, "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False, "num_local_experts": 8, "num_experts_per_tok": 2,
}
SEED = 0
LR = 1e-5
THREADS = 2
PHASES = ("zero_grad", "forward", "backward", "optimizer")
TOP_N = 20


def _configs():
    out = collections.OrderedDict()
    for batch, t in ((1, 25), (1, 128), (1, 512), (2, 64)):
        for adam in ("forloop", "foreach"):
            name = "smollm2_135m_b%d_t%d_fp32_%s" % (batch, t, adam)
            out[name] = dict(batch=batch, seq_len=t, dtype="float32", autocast=None,
                             adam="for-loop" if adam == "forloop" else "foreach")
    out["smollm2_135m_b1_t128_bf16_forloop"] = dict(batch=1, seq_len=128, dtype="bfloat16",
                                                    autocast=None, adam="for-loop")
    out["smollm2_135m_b1_t128_autocast_forloop"] = dict(batch=1, seq_len=128, dtype="float32",
                                                        autocast="bfloat16", adam="for-loop")
    # Qwen3's attention on SmolLM2-135M's shape: q, k, v and o biases, q_norm and k_norm
    out["qwen3_135m_b1_t128_fp32_forloop"] = dict(batch=1, seq_len=128, dtype="float32", autocast=None,
                                                  adam="for-loop", model=QWEN3_135M)
    tiny = dict(dtype="float32", autocast=None, adam="for-loop")
    for kind, model in (("mha", TINY_MHA), ("mqa", TINY_MQA)):
        for batch, t in ((1, 128), (2, 64)):
            out["tiny_%s_b%d_t%d_fp32_forloop" % (kind, batch, t)] = dict(tiny, batch=batch, seq_len=t,
                                                                          model=model)
    # torch.utils.checkpoint around every layer (transformers' gradient_checkpointing_enable()):
    # what each layer keeps beside its input (the RNG state, the mask, the positions, cos and sin)
    # at two lengths, so that the mask's T x (T + 1) growth shows
    for t in (128, 512):
        out["tiny_gqa_ckpt_b1_t%d_fp32_forloop" % t] = dict(tiny, batch=1, seq_len=t, model=TINY,
                                                           checkpointing=True)
    # a mixture of experts: the routing each step took is written beside the figures ("routing"),
    # for membill's meta run to bill the same one (--routing)
    out["mixtral_tiny_b1_t128_fp32_forloop"] = dict(batch=1, seq_len=128, dtype="float32", autocast=None,
                                                    adam="for-loop", model=MIXTRAL_TINY)
    return out


CONFIGS = _configs()

ROLE_OF_SCOPE = {
    "embed": "embed", "mask": "mask", "rope.cos_sin": "rope_cos_sin", "norm": "norm",
    "attn.qkv": "attn_qkv", "attn.rope": "attn_rope", "attn.repeat_kv": "attn_repeat_kv",
    "attn.probs": "attn_probs", "attn.context": "attn_context", "attn.o_proj": "attn_o_proj",
    "residual": "residual", "mlp": "mlp", "final_norm": "final_norm", "logits": "logits",
    "loss": "loss", "moe": "moe",
}
MARKS = set(PHASES) | {"step1", "step2", "drop_output"}


# ---------------------------------------------------------------------------------------------
# One configuration (runs in its own process)


def run_config(name):
    spec = CONFIGS[name]
    torch.set_num_threads(THREADS)
    torch.manual_seed(SEED)
    cfg = L.LlamaConfig(spec.get("model", SMOLLM2_135M))
    model = H.init_weights(H.LlamaForCausalLM(cfg), SEED)
    model.train()
    model.model.gradient_checkpointing = bool(spec.get("checkpointing"))
    if spec["dtype"] == "bfloat16":
        model.to(torch.bfloat16)
    params = list(model.parameters())
    baseline = sum(p.numel() * p.element_size() for p in params)
    g = torch.Generator().manual_seed(SEED + 1)
    untracked = sum(b.numel() * b.element_size() for b in model.buffers())
    opt = torch.optim.Adam(params, lr=LR, foreach=(spec["adam"] == "foreach"))
    fwd_ctx = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if spec["autocast"] \
        else contextlib.nullcontext

    marks = {"grads": {}, "state": {}, "output": {}, "loss": {}}
    routing = []  # per forward, each sparse layer's tokens per expert
    sparse = spec.get("model", {}).get("model_type") == "mixtral"
    gc.collect()
    gc.disable()  # frees happen by reference count only, where the code drops the last one
    H.TRACE = True
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True,
                 record_shapes=True) as prof:
        # the batch is made while profiling, so that its bytes count as live (as "inputs")
        ids = torch.randint(0, cfg.vocab_size, (spec["batch"], spec["seq_len"]), generator=g,
                            dtype=torch.int64)
        for step in (1, 2):
            with record_function("step%d" % step):
                with record_function("zero_grad"):
                    opt.zero_grad(set_to_none=True)
                with record_function("forward"):
                    with fwd_ctx():
                        H.ROUTING = [] if sparse else None
                        out = model(ids, labels=ids)
                        if sparse:
                            routing.append(H.ROUTING)
                        H.ROUTING = None
                        marks["output"][step] = _output_ptrs(out)
                        with record_function("drop_output"):
                            loss = out.loss
                            del out
                with record_function("backward"):
                    loss.backward()
                marks["grads"][step] = {_ptr(p.grad) for p in params if p.grad is not None}
                with record_function("optimizer"):
                    opt.step()
                marks["state"][step] = {_ptr(t) for st in opt.state.values()
                                        for t in st.values() if torch.is_tensor(t)}
                marks["loss"][step] = float(loss)
                del loss
    run_s = time.perf_counter() - t0
    H.TRACE = False
    gc.enable()
    result = analyse(prof, baseline, marks)
    result_cfg = {"name": name, "model": dict(spec.get("model", SMOLLM2_135M)), "batch": spec["batch"],
                  "seq_len": spec["seq_len"], "dtype": spec["dtype"],
                  "autocast": spec["autocast"], "adam": spec["adam"], "lr": LR,
                  "threads": THREADS, "seed": SEED}
    if spec.get("checkpointing"):
        result_cfg["checkpointing"] = True
    doc = collections.OrderedDict()
    doc["schema"] = "membill-pytorch-step/1"
    doc["config"] = result_cfg
    doc["torch_version"] = torch_version()
    doc["baseline_bytes"] = baseline
    doc["inputs_bytes"] = ids.numel() * ids.element_size()
    doc["untracked_bytes"] = untracked
    doc.update(result)
    if sparse:
        doc["routing"] = routing
    return doc, run_s


def torch_version():
    """torch.__version__ of Debian's build reads 1.13.0a0; the package is 1.13.1."""
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "python3-torch"],
                             capture_output=True, text=True, check=True).stdout
        return out.split("+")[0] or torch.__version__
    except (OSError, subprocess.CalledProcessError):
        return torch.__version__


def _ptr(t):
    return t.storage().data_ptr()


def _output_ptrs(out):
    ptrs = {"logits": {_ptr(out.logits)}, "cache": set()}
    cache = out.past_key_values  # None under checkpointing (use_cache turned off)
    for t in (cache.key_cache + cache.value_cache) if cache else ():
        ptrs["cache"].add(_ptr(t))
    return ptrs


# ---------------------------------------------------------------------------------------------
# Analysis of the profile


class Alloc:
    __slots__ = ("t", "size", "ptr", "total", "chain", "idx", "freed_at", "phase", "free_phase")

    def __init__(self, t, size, ptr, total, chain):
        self.t, self.size, self.ptr, self.total, self.chain = t, size, ptr, total, chain
        self.freed_at = None
        self.phase = None
        self.free_phase = None


def _events(prof):
    """Allocation events in time order, the marked ranges, and the running totals checked.

    The record_function ranges this script opens (phase marks and module scopes) cost PyTorch
    1.13 a 4-byte torch.zeros(1) handle (made before the range, freed as it opens) and a
    288-byte block allocated and freed as it opens; both are dropped here, and the totals
    recomputed without them. The optimizer's own ranges (Optimizer.step#Adam.step, ...) stay:
    they are part of a real step.
    """
    tree = prof.profiler.kineto_results.experimental_event_tree()
    events, ranges = [], {}

    def walk(node, chain, path):
        ef = node.extra_fields
        if type(ef).__name__ == "_ExtraFields_Allocation":
            if ef.device.type == "cpu" and ef.alloc_size != 0:
                events.append(Alloc(node.start_time_ns, ef.alloc_size, ef.ptr,
                                    ef.total_allocated, chain))
            return
        if node.name in MARKS:
            path = path + (node.name,)
            ranges[path] = (node.start_time_ns, node.end_time_ns)
        chain = chain + (node,)
        for c in node.children:
            walk(c, chain, path)

    for root in tree:
        walk(root, (), ())
    events.sort(key=lambda e: e.t)
    for i, e in enumerate(events):
        prev = events[i - 1].total if i else 0
        if e.total != prev + e.size:
            raise SystemExit("profile_step: allocator totals do not chain at event %d "
                             "(%d + %d != %d)" % (i, prev, e.size, e.total))
    # drop the marks' own blocks (alloc and free pairs found by address, in order)
    ours = MARKS | set(ROLE_OF_SCOPE)
    drop, open_blocks = set(), {}
    for e in events:
        if e.size > 0:
            open_blocks[e.ptr] = e
            continue
        a = open_blocks.pop(e.ptr, None)
        if a is None or not e.chain or e.chain[-1].name not in ours:
            continue
        inner = [n.name for n in a.chain[-2:]]
        if (a.size == 288 and inner == [e.chain[-1].name, "aten::empty"]) or \
                (a.size == 4 and inner[-2:] == ["aten::zeros", "aten::empty"]
                 and (len(a.chain) == 2 or a.chain[-3].name in ours)):
            drop.add(id(a))
            drop.add(id(e))
    kept, shift = [], 0
    for e in events:
        if id(e) in drop:
            shift += e.size
            continue
        e.total -= shift
        e.idx = len(kept)
        kept.append(e)
    if shift:
        raise SystemExit("profile_step: unbalanced range artifacts (%d bytes)" % shift)
    return kept, ranges


def _inputs(n):
    """(shapes, dtypes) of an op node's inputs, trailing non-tensor arguments dropped."""
    try:
        shapes = [list(x) for x in n.extra_fields.inputs.shapes]
        dtypes = list(n.extra_fields.inputs.dtypes)
    except AttributeError:
        return None, None
    while shapes and shapes[-1] == [] and dtypes[-1] in ("", "Scalar"):
        shapes.pop()
        dtypes.pop()
    return shapes, dtypes


def _label(e):
    """(scope, node, aten op nodes, shapes, dtypes) of an allocation from its enclosing nodes:
    the innermost module range, the autograd node or optimizer, the aten ops below the
    innermost named range (outermost first) and the outermost op's inputs."""
    scope = node = None
    ops = []
    for n in e.chain:
        name = n.name
        if name.startswith("aten::"):
            ops.append(n)
        else:
            ops = []  # only aten ops below the innermost named range
            if name in ROLE_OF_SCOPE:
                scope = name
            elif name.startswith("autograd::engine::evaluate_function: "):
                node = name.split(": ", 1)[1]
            elif name.startswith("Optimizer.") or name.startswith("torch::autograd::"):
                node = name
    shapes, dtypes = _inputs(ops[0]) if ops else (None, None)
    return scope, node, ops, shapes, dtypes


LEAF_OPS = ("aten::empty", "aten::empty_strided", "aten::empty_like", "aten::resize_")


def _op_path(ops):
    """'aten::linear > aten::matmul > aten::mm': the aten ops that made the block, without the
    allocating leaf (empty, empty_strided, ...) and without aten::to before aten::_to_copy."""
    names = [n.name for n in ops]
    while len(names) > 1 and names[-1] in LEAF_OPS:
        names.pop()
    names = [x for i, x in enumerate(names)
             if not (x == "aten::to" and i + 1 < len(names) and names[i + 1] == "aten::_to_copy")]
    return " > ".join(names) if names else "(python)"


def _is_weight_cast(e):
    """An autocast copy of a weight: a _to_copy of a 2-D float tensor inside a linear."""
    _, _, ops, _, _ = _label(e)
    names = [n.name for n in ops]
    if "aten::linear" not in names or "aten::_to_copy" not in names:
        return False
    shapes, dtypes = _inputs(ops[names.index("aten::_to_copy")])
    return bool(shapes) and len(shapes[0]) == 2 and dtypes[0] == "float"


def _where(e):
    scope, node, ops, _, _ = _label(e)
    return " > ".join(x for x in (scope, node, _op_path(ops) if ops else None) if x) \
        or "(python)"


def analyse(prof, baseline, marks):
    events, ranges = _events(prof)
    times = [e.t for e in events]

    def live_at(t):  # live after every event at or before t
        i = bisect.bisect_right(times, t)
        return baseline + (events[i - 1].total if i else 0)

    def span(t0, t1):
        return bisect.bisect_left(times, t0), bisect.bisect_right(times, t1)

    # pair allocations with their frees (addresses are reused only after a free)
    open_blocks = {}
    for e in events:
        if e.size > 0:
            open_blocks[e.ptr] = e
        else:
            a = open_blocks.pop(e.ptr, None)
            if a is not None:
                a.freed_at = e.t
    phase_of = []
    for step in (1, 2):
        for ph in PHASES:
            t0, t1 = ranges[("step%d" % step, ph)]
            phase_of.append((t0, t1, "step%d/%s" % (step, ph)))

    def phase_name(t):
        for t0, t1, nm in phase_of:
            if t0 <= t <= t1:
                return nm
        return "outside"

    for e in events:
        if e.size > 0:
            e.phase = phase_name(e.t)
            e.free_phase = phase_name(e.freed_at) if e.freed_at is not None else "live"

    steps, tops = [], collections.OrderedDict()
    for step in (1, 2):
        sk = "step%d" % step
        phases, tops[sk] = [], collections.OrderedDict()
        for ph in PHASES:
            t0, t1 = ranges[(sk, ph)]
            i0, i1 = span(t0, t1)
            inside = events[i0:i1]
            start = live_at(t0 - 1)
            peak, peak_e = start, None
            for e in inside:
                if baseline + e.total > peak:
                    peak, peak_e = baseline + e.total, e
            allocs = [e for e in inside if e.size > 0]
            phases.append(collections.OrderedDict([
                ("name", ph), ("start_live_bytes", start), ("peak_bytes", peak),
                ("end_live_bytes", live_at(t1)),
                ("peak_op", _where(peak_e) if peak_e else None),
                ("peak_alloc_bytes", peak_e.size if peak_e else None),
                ("allocated_bytes", sum(e.size for e in allocs)),
                ("allocations", len(allocs))]))
            tops[sk][ph] = [_alloc_record(e) for e in
                            sorted(allocs, key=lambda e: (-e.size, e.t))[:TOP_N]]
        best = max(phases, key=lambda p: p["peak_bytes"])
        f0, f1 = ranges[(sk, "forward")]
        d0, _ = ranges[(sk, "forward", "drop_output")]
        fwd_allocs = [e for e in events[slice(*span(f0, f1))] if e.size > 0]
        kept = [e for e in fwd_allocs if e.freed_at is None or e.freed_at > f1]
        before_drop = [e for e in fwd_allocs if e.freed_at is None or e.freed_at > d0]
        out_ptrs = marks["output"][step]
        kept_ids = {id(e) for e in kept}
        held = collections.Counter()
        for e in before_drop:
            if id(e) not in kept_ids:
                held[_role(e, out_ptrs)] += e.size
        by_role = collections.Counter()
        by_op = collections.defaultdict(collections.Counter)
        for e in kept:
            role = _role(e, out_ptrs)
            by_role[role] += e.size
            by_op[role][(_op_label(e), e.size)] += 1
        peak_t = _peak_time(events, ranges, sk, best["name"], baseline, best["peak_bytes"])
        steps.append(collections.OrderedDict([
            ("step", step), ("loss", marks["loss"][step]),
            ("phases", phases), ("peak_bytes", best["peak_bytes"]),
            ("peak_phase", best["name"]), ("peak_op", best["peak_op"]),
            ("live_after_forward_bytes", live_at(f1)),
            ("output_bytes", live_at(d0) - live_at(f1)),
            ("saved_after_forward_bytes", sum(e.size for e in kept)),
            ("saved_by_role", _sorted_counter(by_role)),
            ("held_by_output_by_role", _sorted_counter(held)),
            ("saved_by_op", collections.OrderedDict(
                (role, [collections.OrderedDict([("op", op), ("bytes", size), ("count", n)])
                        for (op, size), n in sorted(c.items(), key=lambda kv: -kv[0][1] * kv[1])])
                for role, c in sorted(by_op.items(), key=lambda kv: -by_role[kv[0]]))),
            ("live_at_peak", _live_at(events, peak_t, baseline, marks, step, ranges)),
        ]))
    overall = max(steps, key=lambda s: s["peak_bytes"])
    doc = collections.OrderedDict()
    doc["steps"] = steps
    doc["peak_bytes"] = overall["peak_bytes"]
    doc["peak_phase"] = "step%d/%s" % (overall["step"], overall["peak_phase"])
    doc["saved_after_forward_bytes"] = steps[0]["live_after_forward_bytes"] - baseline
    doc["saved_by_role"] = steps[0]["saved_by_role"]
    doc["top_allocations"] = tops
    return doc


def _role(e, out_ptrs):
    if e.ptr in out_ptrs["cache"]:
        return "cache"
    if e.ptr in out_ptrs["logits"]:
        return "logits"
    if _is_weight_cast(e):
        return "autocast_weight_cast"
    scope = _label(e)[0]
    return ROLE_OF_SCOPE.get(scope, "other")


def _op_label(e):
    _, _, ops, _, _ = _label(e)
    s = _op_path(ops)
    names = [n.name for n in ops]
    if "aten::_to_copy" in names:  # a cast: name what it casts
        shapes, dtypes = _inputs(ops[names.index("aten::_to_copy")])
        if shapes:
            s += " of %s%s" % (dtypes[0], shapes[0])
    return s


def _peak_time(events, ranges, sk, ph, baseline, peak):
    t0, t1 = ranges[(sk, ph)]
    for e in events:
        if t0 <= e.t <= t1 and baseline + e.total == peak:
            return e.t
    return t0


def _live_at(events, t, baseline, marks, step, ranges):
    """Blocks live right after the event at time t, by origin. A block is a gradient (an
    Adam state tensor) when it is the one at a .grad (state) address when backward (the
    optimizer step) ends: addresses are reused, so the address alone does not say."""
    sk = "step%d" % step
    b_end = ranges[(sk, "backward")][1]
    o_end = ranges[(sk, "optimizer")][1]
    grads, state = marks["grads"][step], marks["state"][step]
    out_ptrs = marks["output"][step]
    f0, f1 = ranges[(sk, "forward")]

    def alive(e, at):
        return e.t <= at and (e.freed_at is None or e.freed_at > at)

    c = collections.Counter()
    c["weights"] = baseline
    for e in events:
        if e.t > t:
            break
        if e.size <= 0 or (e.freed_at is not None and e.freed_at <= t):
            continue
        if e.ptr in state and alive(e, o_end):
            c["adam_state"] += e.size
        elif e.ptr in grads and alive(e, b_end):
            c["grads"] += e.size
        elif f0 <= e.t <= f1:
            c["forward:" + _role(e, out_ptrs)] += e.size
        elif e.phase == "outside":
            c["inputs"] += e.size
        else:
            c[e.phase + " temporary"] += e.size
    return _sorted_counter(c)


def _sorted_counter(c):
    return collections.OrderedDict(sorted(((k, v) for k, v in c.items() if v),
                                          key=lambda kv: -kv[1]))


def _alloc_record(e):
    scope, node, ops, shapes, dtypes = _label(e)
    return collections.OrderedDict([
        ("bytes", e.size), ("op", _op_label(e)), ("node", node), ("scope", scope),
        ("shapes", shapes), ("dtypes", dtypes), ("freed_in", e.free_phase)])


# ---------------------------------------------------------------------------------------------
# Driver


def _flat(obj):
    """No dict below obj (dicts and lists of numbers, strings and lists only)."""
    if isinstance(obj, dict):
        return all(not isinstance(v, dict) and _flat(v) for v in obj.values())
    if isinstance(obj, list):
        return all(not isinstance(v, dict) and _flat(v) for v in obj)
    return True


def dumps(obj, indent=0, width=100):
    """JSON, one line for each object that fits in `width` columns or holds no object."""
    one = json.dumps(obj, separators=(", ", ": "))
    if not isinstance(obj, (dict, list)) or not obj or len(one) + indent <= width or \
            (isinstance(obj, dict) and _flat(obj)):
        return one
    pad, pad_in = " " * indent, " " * (indent + 1)
    if isinstance(obj, dict):
        items = ["%s%s: %s" % (pad_in, json.dumps(k), dumps(v, indent + 1, width))
                 for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    items = [pad_in + dumps(v, indent + 1, width) for v in obj]
    return "[\n" + ",\n".join(items) + "\n" + pad + "]"


def check_model():
    """hf_llama's LlamaForCausalLM against llama_ref on a tiny tied GQA model in float64 (the
    loss is float32 in both: ForCausalLMLoss upcasts with .float()): same loss, same gradients;
    the same for a tiny Mixtral (its sparse blocks)."""
    tiny = {"hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256,
            "max_position_embeddings": 128, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
            "tie_word_embeddings": True}
    check_one(tiny)
    check_one(dict(tiny, model_type="mixtral", num_local_experts=4, num_experts_per_tok=2,
                   tie_word_embeddings=False))


def check_one(fields):
    cfg = L.LlamaConfig(fields)
    params = {k: v.double().detach().requires_grad_(True)
              for k, v in L.init_params(cfg, 7, std=0.1, norm_noise=0.1).items()}
    model = H.load_params(H.LlamaForCausalLM(cfg).double(), params)
    ids = torch.randint(0, cfg.vocab_size, (2, 9), generator=torch.Generator().manual_seed(8))
    ref = L.loss_fn(cfg, params, ids)
    ref.backward()
    out = model(ids, labels=ids)
    out.loss.backward()
    named = dict(model.named_parameters())
    err = max((named[k].grad - params[k].grad).abs().max().item() for k in params)
    if abs(out.loss.item() - ref.item()) > 1e-5 or err > 1e-5:
        raise SystemExit("profile_step: hf_llama disagrees with llama_ref (loss %r vs %r, "
                         "grad error %g)" % (out.loss.item(), ref.item(), err))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="tests/golden/pytorch")
    ap.add_argument("--only", action="append", help="configuration name (repeatable)")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.list:
        print("\n".join(CONFIGS))
        return
    if args.child:
        doc, run_s = run_config(args.child)
        path = os.path.join(args.out, args.child + ".json")
        with open(path, "w") as f:
            f.write(dumps(doc) + "\n")
        s1, s2 = doc["steps"]
        print("%-40s step1 %14s %-9s step2 %14s %-9s saved %12s  (%.1f s)" % (
            args.child, "{:,}".format(s1["peak_bytes"]), s1["peak_phase"],
            "{:,}".format(s2["peak_bytes"]), s2["peak_phase"],
            "{:,}".format(doc["saved_after_forward_bytes"]), run_s), flush=True)
        return
    if not torch.__version__.startswith("1.13"):
        raise SystemExit("profile_step: needs PyTorch 1.13 (/usr/bin/python3 with Debian's "
                         "python3-torch), found %s" % torch.__version__)
    check_model()
    names = args.only or list(CONFIGS)
    for n in names:
        if n not in CONFIGS:
            raise SystemExit("profile_step: unknown configuration %s (see --list)" % n)
    os.makedirs(args.out, exist_ok=True)
    t0 = time.perf_counter()
    for n in names:
        # a fresh process each: the allocator's running total starts at zero
        subprocess.run([sys.executable, os.path.abspath(__file__), "--out", args.out,
                        "--child", n], check=True)
    print("done in %.0f s" % (time.perf_counter() - t0))


if __name__ == "__main__":
    main()
