"""Where a training step's time goes: milliseconds a step by operator group, and the share of the sgemm limit.

    python tests/tools/profile_step.py --preset cpu --data-dir ../shared/data/multi30k --threads 2   # the cpu preset
    python tests/tools/profile_step.py                      # smoke preset on the repository's Multi30k slice, < 1 min
    python tests/tools/profile_step.py --preset iwslt14 --data-dir ''   # on a GPU: kernel time by group

It loads the notebook's cells (as benchmark.py does), builds the preset's model, optimiser and batches, and runs the
notebook's own train_step: --warmup untimed steps, then --steps timed ones without the profiler (the step time
below), then the same batches again under torch.profiler. Each operator's self time (device time on a GPU) is put into one
group: matrix products; anything else that reads or writes a tensor whose last dimension is the vocabulary (the
loss, its gradient, the logits' casts); attention (SDPA); dropout (on a CPU its random numbers, on a GPU its fused
kernel); layer norm; Adam; the rest. The
groups' shares of the profiled time are scaled to the unprofiled step time. The GPU path has not been run yet.

The sgemm limit: every matrix product of the profiled steps is replayed alone, at its own shape, and timed; the
limit is the steps' matrix-product FLOPs over that replay time, the GFLOP/s this machine's sgemm reaches on the
model's own shapes, in the step's dtype (bf16 or fp16 under a GPU's autocast). The share is the step's FLOPs per second over that limit: the fraction of the step that the
matrix products alone, at full speed, would take. It prints a table and one line `PROFILE_JSON {...}`.
A timing taken while another job runs is worthless: run it alone.
"""

from __future__ import annotations

import argparse
import collections
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # common.py beside this file
from common import load_notebook_module, sync

CUDA = torch.cuda.is_available()
MATMUL = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"}
GROUPS = ["matrix products", "over the vocabulary (loss, its gradient)", "attention (SDPA)",
          "dropout", "layer norm", "Adam", "the rest"]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", help="notebook preset (default: iwslt14 on a GPU, smoke without one)")
    p.add_argument("--data-dir", default="tests/data/multi30k",
                   help="folder of {train,validation,test}.{de,en}; '' for the preset's own data")
    p.add_argument("--steps", type=int, default=20, help="timed steps, and as many profiled (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps before them (default 3)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (default 0: torch's choice)")
    p.add_argument("--top", type=int, default=0, help="also print each group's N largest operators")
    return p.parse_args()


def group_of(name: str, shapes: list, vocab: int) -> str:
    if name in MATMUL:
        return GROUPS[0]
    if any(isinstance(s, list) and len(s) >= 2 and s[-1] == vocab for s in shapes):
        return GROUPS[1]
    if "scaled_dot_product" in name or "flash_attention" in name or "efficient_attention" in name:
        return GROUPS[2]
    if name in ("aten::uniform_", "aten::bernoulli_", "aten::random_", "aten::normal_") or "dropout" in name:
        return GROUPS[3]
    if "layer_norm" in name:
        return GROUPS[4]
    if "adam" in name.lower():
        return GROUPS[5]
    return GROUPS[6]


def matmul_flops(name: str, shapes: list) -> float:
    """FLOPs of one matrix product from its input shapes (mm: [M,K],[K,N]; addmm: bias,[M,K],[K,N]; bmm: 3-D)."""
    a, b = (shapes[1], shapes[2]) if name in ("aten::addmm", "aten::baddbmm") else (shapes[0], shapes[1])
    batch = a[0] if len(a) == 3 else 1
    return 2.0 * batch * a[-2] * a[-1] * b[-1]


def profiled(run, vocab: int) -> tuple[collections.Counter, collections.Counter, float | None]:
    """run() under torch.profiler: each operator's own time in microseconds (device time on a GPU) by (group,
    operator), how often each matrix product (operator, input shapes as JSON) ran, and on a GPU the kernels' own
    time in microseconds, attributed to an operator or not (None on a CPU): the operators' sum should come near it."""
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if CUDA else [])
    with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
        run()
    by_op, products, kernels = collections.Counter(), collections.Counter(), 0.0 if CUDA else None
    for event in prof.key_averages(group_by_input_shape=True):
        if CUDA and not event.key.startswith("aten::"):  # a kernel's own row or an annotation: counted under its op
            if event.device_type == torch.autograd.DeviceType.CUDA and not getattr(event, "is_user_annotation", False):
                kernels += event.self_device_time_total  # a kernel's own row
            continue
        own = event.self_device_time_total if CUDA else event.self_cpu_time_total  # microseconds
        by_op[(group_of(event.key, event.input_shapes, vocab), event.key)] += own
        if event.key in MATMUL:
            products[(event.key, json.dumps(event.input_shapes))] += event.count
    return by_op, products, kernels


def grouped(by_op: collections.Counter) -> collections.Counter:
    """The operators' times summed by group."""
    by_group = collections.Counter()
    for (group, _), own in by_op.items():
        by_group[group] += own
    return by_group


def product_flops(products: collections.Counter) -> float:
    return sum(count * matmul_flops(name, json.loads(shapes)) for (name, shapes), count in products.items())


def replay_seconds(name: str, shapes: list, device, dtype, repeats: int = 5, calls: int = 10) -> float:
    """The best time of one matrix product of these shapes and this dtype, alone (the mean of `calls` in a row)."""
    a_shape, b_shape = (shapes[1], shapes[2]) if name in ("aten::addmm", "aten::baddbmm") else (shapes[0], shapes[1])
    a, b = torch.randn(a_shape, device=device, dtype=dtype), torch.randn(b_shape, device=device, dtype=dtype)
    product = torch.bmm if len(a_shape) == 3 else torch.mm
    best = float("inf")
    for _ in range(repeats + 1):
        sync()
        start = time.perf_counter()
        for _ in range(calls):
            product(a, b)
        sync()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def main():
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    preset = args.preset or ("iwslt14" if CUDA else "smoke")
    torch.set_num_threads(1)  # the notebook's cells train a toy model: many small ops
    with tempfile.TemporaryDirectory() as tmp:
        m = load_notebook_module(preset, args.data_dir, tmp)
    torch.set_num_threads(threads)
    cfg, device = m.cfg, m.device
    amp_dtype, scaler = m.autocast_dtype(device, cfg.amp), torch.amp.GradScaler(device.type)
    batches = m.make_batches(*m.data["train"], cfg.max_tokens, device.type == "cuda")
    order = m.epoch_order(len(batches), cfg.seed, 0)
    schedule = [batches[order[j % len(order)]].to(device) for j in range(args.warmup + args.steps)]
    m.seed_everything(cfg.seed)
    model = m.build_model(cfg, m.VOCAB).to(device)
    optimizer = m.make_optimizer(model, cfg)

    def run(batches: list, first: int) -> None:
        for j, batch in enumerate(batches):
            m.train_step(model, batch, optimizer, scaler, amp_dtype, cfg, first + j).item()  # .item(): wait for it

    run(schedule[: args.warmup], 1)
    timed = schedule[args.warmup: args.warmup + args.steps]
    start = time.perf_counter()
    run(timed, args.warmup + 1)
    step_ms = (time.perf_counter() - start) / args.steps * 1000
    by_op, products, _ = profiled(lambda: run(timed, args.warmup + args.steps + 1), m.VOCAB)  # the same shapes again
    by_group = grouped(by_op)
    total = sum(by_group.values())
    flops, replay = product_flops(products), 0.0
    for (name, shapes), count in products.items():
        replay += count * replay_seconds(name, json.loads(shapes), device, amp_dtype or torch.float32)
    steps = args.steps
    tokens = sum(b.n_tokens for b in timed) / len(timed)
    limit, achieved = flops / replay / 1e9, flops / steps / (step_ms / 1000) / 1e9
    info = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "torch": torch.__version__,
            "device": torch.cuda.get_device_name(0) if CUDA else f"CPU {platform.machine()}, {threads} threads",
            "preset": preset, "steps": args.steps, "target_tokens_per_step": round(tokens),
            "step_ms": round(step_ms, 1),
            "groups_ms": {g: round(by_group[g] / total * step_ms, 1) for g in GROUPS},
            "gflop_per_step": round(flops / steps / 1e9, 2), "sgemm_limit_gflops": round(limit, 1),
            "step_gflops": round(achieved, 1), "sgemm_share": round(achieved / limit, 3)}
    print(f"{info['device']}, torch {info['torch']}, preset {preset}: {step_ms:.0f} ms a step "
          f"({args.steps} steps, {tokens:,.0f} target tokens a step)")
    print("| what | ms a step | share |\n| --- | ---: | ---: |")
    for g in GROUPS:
        print(f"| {g} | {info['groups_ms'][g]:.1f} | {by_group[g] / total:.0%} |")
    for g in GROUPS if args.top else []:
        largest = sorted(((t, op) for (group, op), t in by_op.items() if group == g), reverse=True)[: args.top]
        print(f"{g}: " + ", ".join(f"{op.removeprefix('aten::')} {t / total * step_ms:.1f}" for t, op in largest))
    print(f"matrix products: {info['gflop_per_step']} GFLOP a step; this machine's sgemm on these shapes "
          f"{limit:.1f} GFLOP/s; the step runs at {achieved:.1f} GFLOP/s, {achieved / limit:.0%} of that limit")
    print("PROFILE_JSON " + json.dumps(info))


if __name__ == "__main__":
    main()
