"""What only a GPU can measure, in one JSON file: part of the one command of a GPU run (gpu_run.py).

    python tests/tools/gpu_check.py             # on a CUDA machine: writes results/gpu/<device name>.json
    python tests/tools/gpu_check.py --dry-run   # on a CPU: every phase at smoke sizes, (tests/test_tools.py runs it)

Without a CUDA GPU (and without --dry-run) it says so and exits 0, having run and written nothing. On a GPU it runs
its phases in this order (what the GPU issue asks first comes first), each on its own and each within its own time
limit (PHASE_LIMITS_S, and never past --deadline-s or --deadline-at; a dry run has only the deadline): a phase
that fails or runs out of time records its error (and what it had measured) and the next one runs; the file is
rewritten after each phase, and after each batch size of phase 1.

1. batch_sizes: the `iwslt14` preset's model trained by the notebook's own train_step on the batches make_batches
   makes at 4,096, 8,192, 16,384 and 32,768 tokens a batch from the Hub-style IWSLT14 *validation* text (7,283 pairs,
   standing in for the 160,239-pair training split, which cannot be had offline). For each size: one untimed pass
   over every batch (every batch shape seen once), then --passes timed passes: the steady step time (wall clock),
   target tokens a second and peak memory; then each batch once more with the GPU held busy by a sleep kernel, so
   that the host issues the whole step before the GPU starts it: the host's time to issue a step (wall clock) and
   the GPU's time to run it back to back (CUDA events); then a few steps under torch.profiler: the GPU's kernel
   time split into matrix products and the rest (profile_step.py's groups), and the products' FLOPs.
2. projection: a Colab T4's step, arithmetic from phase 1 (a projection, not a measurement): the GPU time's matrix
   products scaled by this GPU's published tensor peak over the T4's 65 TFLOP/s fp16, the rest by this GPU's memory
   bandwidth over the T4's 320 GB/s, the host's time as measured and twice it (Colab's slower CPU, assumed); the
   step is the larger of host and GPU (the training loop does not wait for the GPU at each step); then target
   tokens a second, the real training split's epoch and the epochs in the preset's time budget, per batch size.
3. benchmark: `tests/tools/benchmark.py --preset multi30k`: the notebook's model against nn.Transformer at the
   multi30k preset's sizes at steady state (both on the device throughout, every timed shape seen first, 240 steps
   of each in 8 interleaved rounds: the ratio with its spread), and decoding (Multi30k from --multi30k-dir, else
   ../shared/data/multi30k, else the slice in tests/data).
4. iwslt14_train: the iwslt14 preset trained by the notebook's own train() for --epochs epochs on the Hub's
   validation text, validated on the same text: steps, seconds and peak memory of each epoch (the whole loop:
   validation and checkpoints included), and a projection to the real training split at this GPU's speed.
5. evaluation: how long section 11 takes on the real 6,750-sentence test set, timed with the weights phase 4 trained
   (a weak model; untrained weights of the same shape if phase 4 failed: they decode to the length limit, so the
   times over-estimate). Timed: greedy and beam on the test set, greedy on (up to) 1,000 validation sentences, the
   beam / alpha sweep on the same validation sentences, and greedy under training's autocast (its time, and the share
   of outputs equal to fp32: the notebook decodes in fp32); `estimate_evaluation_s` adds them up as section 11 runs
   them for the projected number of epochs.
6. memory: `tests/tools/benchmark.py --memory iwslt14`: the iwslt14 preset's training memory at its max_tokens on
   the worst batch shapes.

The whole-notebook runs (multi30k in bf16, and in fp16 with the gradient scaler for the whole run) are gpu_run.py's
parts before this one. The Hub-style text is looked for in --iwslt14-dir, then shared/data/iwslt14/hub under the
repository, ../shared beside it, /work/shared, and tests/data/iwslt14. With --dry-run the phases run on this
machine's device at smoke sizes (the smoke preset, the repository's slices, a few steps and sentences) and the file
is named after the CPU: only that the phases run, never what they measure (the projection then uses the T4's own
figures in place of the device's: its arithmetic runs, its numbers mean nothing).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # common.py, benchmark.py and profile_step.py beside it
from common import (
    ROOT,
    TESTS,
    TOOLS,
    current_commit,
    load_notebook_module,
    sync,
    write_json,
)

PHASES = ("batch_sizes", "projection", "benchmark", "iwslt14_train", "evaluation", "memory")
PHASE_LIMITS_S = {"batch_sizes": 150, "projection": 10, "benchmark": 120, "iwslt14_train": 60, "evaluation": 90,
                  "memory": 40}  # each phase's own limit on a GPU (what it is expected to take on an H100, and room)
BATCH_SIZES = (4096, 8192, 16384, 32768)  # tokens a batch measured by phase 1 (the iwslt14 preset's is 4,096)
DRY_BATCH_SIZES = (1024, 2048)  # a dry run's, on the smoke preset, a few batches each
DRY_SENTENCES = 8  # sentences decoded by a dry run's phases
IWSLT14_TRAIN_PAIRS = 160_239  # the Hub's training split (fairseq's prepare-iwslt14.sh)
T4 = {"name": "Tesla T4", "tflops": 65.0, "gb_s": 320.0}  # NVIDIA's published fp16 tensor peak and memory bandwidth
PUBLISHED = (  # (name pattern, dense fp16/bf16 tensor TFLOP/s, memory GB/s): the makers' datasheets, no sparsity
    (r"H100.*PCIe", 756.0, 2000.0), (r"H100 NVL", 835.0, 3900.0), (r"H100", 989.4, 3350.0),
    (r"H200", 989.4, 4800.0), (r"A100.*80GB", 312.0, 2039.0), (r"A100", 312.0, 1555.0), (r"L4\b", 121.0, 300.0),
    (r"T4\b", 65.0, 320.0))
HOST_FACTORS = (1.0, 2.0)  # a T4 machine's host against this one's: as fast, and twice as slow (Colab; assumed)
NO_GPU = "No CUDA GPU here: gpu_check.py measures only on a GPU. Nothing was run and nothing was written."


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "results" / "gpu"), help="folder for <device name>.json")
    p.add_argument("--skip", default="", help=f"phases to leave out, comma-separated: {', '.join(PHASES)}")
    p.add_argument("--iwslt14-dir", help="a folder of Hub-style validation.{de,en} and test.{de,en}")
    p.add_argument("--multi30k-dir", help="Multi30k for the benchmark (default: ../shared/data/multi30k, else the "
                   "slice in tests/data/multi30k)")
    p.add_argument("--epochs", type=int, default=2, help="epochs of phase 4 (the first one meets every batch shape "
                   "for the first time, the last one is the steady speed)")
    p.add_argument("--passes", type=int, default=2, help="timed passes over every batch at each of phase 1's sizes")
    p.add_argument("--deadline-s", type=float, default=math.inf, help="seconds from now by which every phase has "
                   "ended: a phase gets the smaller of its own limit and what is left")
    p.add_argument("--deadline-at", type=float, default=math.inf, help="the same as a Unix time (gpu_run.py's budget: "
                   "counted from before this process started, so that importing torch is inside it)")
    p.add_argument("--dry-run", action="store_true", help="on any device, every phase at smoke sizes in seconds: "
                   "that the command runs, not what it measures")
    args = p.parse_args(argv)
    unknown = set(filter(None, args.skip.split(","))) - set(PHASES)
    if unknown:
        p.error(f"--skip: unknown phase(s) {', '.join(sorted(unknown))}; the phases are {', '.join(PHASES)}")
    return args


# ---------------------------------------------------------------------------------------------------------------------
# pure helpers (tested on a CPU)


def results_path(out_dir: str | Path, device_name: str) -> Path:
    """out_dir/<device name>.json, the name made safe for a file name ("Tesla T4" -> Tesla_T4.json)."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", device_name).strip("._") or "gpu"
    return Path(out_dir) / f"{safe}.json"


def data_candidates(kind: str, given: str | None = None) -> list[Path]:
    """Where to look for `kind` ("iwslt14/hub" or "multi30k") data: the given folder, then shared/data/<kind> in
    the repository, ../shared beside it, /work/shared, and (for IWSLT14) the test slice in tests/data/iwslt14."""
    found = [Path(given)] if given else []
    found += [base / "data" / kind for base in (ROOT / "shared", ROOT.parent / "shared", Path("/work/shared"))]
    if kind.startswith("iwslt14"):
        found += [TESTS / "data" / "iwslt14" / "hub", TESTS / "data" / "iwslt14"]
    return found


def find_folder(candidates: list[Path], files: tuple[str, ...]) -> Path | None:
    """The first candidate folder that holds all of `files`."""
    return next((c for c in candidates if all((c / f).is_file() for f in files)), None)


def iwslt14_training_folder(hub: Path, dest: Path) -> Path:
    """A TRANSFORMER_DATA_DIR folder in `dest`: the Hub-style validation text as training and validation data, and
    the test set as it is."""
    dest.mkdir(parents=True, exist_ok=True)
    for lang in ("de", "en"):
        for split, source in (("train", "validation"), ("validation", "validation"), ("test", "test")):
            shutil.copyfile(hub / f"{source}.{lang}", dest / f"{split}.{lang}")
    return dest


def line_count(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def notebook_summary(text: str) -> dict:
    """The figures a smoke run of the notebook prints: BLEU lines and the training line."""
    bleu = [{"weights": w.strip(), "decoding": d.strip(), "bleu": float(b)}
            for w, d, b in re.findall(r"^ *(.+?) weights, +(.+?): BLEU = +([\d.]+)", text, re.MULTILINE)]
    trained = re.search(r"(\d+) steps in ([\d.]+) min; .*?(\d+) steps skipped", text)
    return {"bleu": bleu, "train_steps": int(trained[1]) if trained else None,
            "train_min": float(trained[2]) if trained else None,
            "skipped_steps": int(trained[3]) if trained else None}


def benchmark_json(output: str) -> dict:
    """The BENCHMARK_JSON line of tests/tools/benchmark.py's output."""
    lines = [line for line in output.splitlines() if line.startswith("BENCHMARK_JSON ")]
    if not lines:
        raise RuntimeError("benchmark.py printed no BENCHMARK_JSON line:\n" + output[-3000:])
    return json.loads(lines[-1].split(" ", 1)[1])


def training_projection(epochs: list[dict], validation_s: float, pairs: int, budget_min: float,
                        real_pairs: int = IWSLT14_TRAIN_PAIRS) -> dict:
    """The last (steady) epoch scaled to the real training split: its training time grows with the pairs, the
    validation (the real validation set is the text validated on here) does not."""
    last = epochs[-1]
    ratio = real_pairs / pairs
    epoch_s = max(last["seconds"] - validation_s, 0.0) * ratio + validation_s
    return {"pairs_ratio": round(ratio, 2), "steps_per_epoch": round(last["steps"] * ratio),
            "epoch_s": round(epoch_s, 1), "epochs_in_budget": round(budget_min * 60 / epoch_s, 2)}


def estimate_evaluation_s(timing: dict, weight_files: int, weight_sets: int = 2) -> float:
    """Section 11's decoding time: for each weight set a greedy validation decoding and greedy and beam on the test
    set; a greedy validation decoding for each kept weight file (every epoch's, and the snapshots); the sweep; and the
    second scoring with the sweep's choice, for each weight set a greedy validation decoding and a beam decoding of
    the test set, counted at the preset's beam (a larger chosen beam takes longer: a lower bound)."""
    per_set = timing["valid_greedy_s"] + timing["test_greedy_s"] + timing["test_beam_s"]
    rescoring = timing["valid_greedy_s"] + timing["test_beam_s"]
    return round(weight_sets * (per_set + rescoring) + weight_files * timing["valid_greedy_s"] + timing["sweep_s"], 1)




def published_figures(device_name: str) -> dict | None:
    """The maker's dense fp16/bf16 tensor peak (TFLOP/s) and memory bandwidth (GB/s) of a GPU, by its name; None for
    one not in PUBLISHED."""
    for pattern, tflops, gb_s in PUBLISHED:
        if re.search(pattern, device_name):
            return {"name": device_name, "tflops": tflops, "gb_s": gb_s}
    return None


def gpu_seconds(row: dict) -> tuple[float, str]:
    """A phase-1 row's GPU time per step and where it comes from: CUDA events after a sleep (gpu_s), unless most of
    those steps waited for the GPU (host_waited: then the events hold the host's time too) and the profiler measured
    kernel time; a CPU dry run has neither and gives the step's wall time."""
    if row.get("gpu_s") is None:
        return row["step_s"], "step_s (no GPU)"
    if row.get("host_waited", 0) > row.get("split_steps", 0) / 2 and row.get("profiled_ms_per_step"):
        return row["profiled_ms_per_step"] / 1e3, "profiled_ms_per_step (the host waited in the split)"
    return row["gpu_s"], "gpu_s"


def t4_projection(rows: list[dict], device: dict, pairs_ratio: float, budget_min: float,
                  host_factors: tuple[float, ...] = HOST_FACTORS) -> list[dict]:
    """A T4's step at each of phase 1's batch sizes, projected from this GPU's (a projection, not a measurement).
    A row's GPU time (gpu_seconds: CUDA events, or the profiler's kernels; a CPU's wall time) is split by its
    matmul_share: the matrix products scale with the tensor peak (this GPU's over the T4's, and never faster than
    their FLOPs at the T4's peak), the rest with the memory bandwidth (an upper bound where kernel launches, not
    bytes, bound it); the host's time (host_s) is the same, or host_factors times it. The
    step is the larger of host and GPU; then target tokens a second, the real training split's epoch
    (epoch_tokens x pairs_ratio) and the epochs in budget_min minutes, one value per host factor."""
    out = []
    for row in rows:
        gpu_s, source = gpu_seconds(row)
        matmul_s = max(gpu_s * row["matmul_share"] * device["tflops"] / T4["tflops"],
                       row["gflop_per_step"] / (T4["tflops"] * 1e3))
        rest_s = gpu_s * (1 - row["matmul_share"]) * device["gb_s"] / T4["gb_s"]
        steps = [max(row["host_s"] * f, matmul_s + rest_s) for f in host_factors]
        tokens_per_s = [row["target_tokens_per_step"] / s for s in steps]
        epoch_s = [row["epoch_target_tokens"] * pairs_ratio / t for t in tokens_per_s]
        out.append({"max_tokens": row["max_tokens"], "gpu_s_from": source, "t4_matmul_ms": round(matmul_s * 1e3, 2),
                    "t4_rest_ms": round(rest_s * 1e3, 2), "t4_gpu_ms": round((matmul_s + rest_s) * 1e3, 2),
                    "host_ms": [round(row["host_s"] * f * 1e3, 2) for f in host_factors],
                    "t4_step_ms": [round(s * 1e3, 2) for s in steps],
                    "bound_by": ["host" if row["host_s"] * f >= matmul_s + rest_s else "gpu" for f in host_factors],
                    "t4_target_tokens_per_s": [round(t) for t in tokens_per_s],
                    "epoch_s": [round(e, 1) for e in epoch_s],
                    "epochs_in_budget": [round(budget_min * 60 / e, 2) for e in epoch_s]})
    return out

# ---------------------------------------------------------------------------------------------------------------------
# measurements (any device; tested on a CPU with tiny sizes)


def memory_mib(device: torch.device) -> dict:
    if device.type != "cuda":
        return {"peak_allocated_mib": None, "peak_reserved_mib": None}
    return {"peak_allocated_mib": round(torch.cuda.max_memory_allocated(device) / 2**20, 1),
            "peak_reserved_mib": round(torch.cuda.max_memory_reserved(device) / 2**20, 1)}


class PhaseTimeout(BaseException):
    """A phase ran past its time limit. A BaseException, as KeyboardInterrupt is, so that the notebook's handlers
    (`except Exception` around a write, a checkpoint, the BPE file) pass it on instead of naming another cause."""


@contextmanager
def time_limit(seconds: float):
    """Raise PhaseTimeout in the main thread once `seconds` have passed (a CUDA call in flight finishes first)."""
    def expire(signum, frame):
        raise PhaseTimeout(f"ran past its limit of {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def train_epochs(m, model, cfg, train_batches, valid_batches, device, fingerprint: dict, epochs: int) -> dict:
    """Train with the notebook's train() one epoch at a time (each call resumes from the last one's checkpoint):
    per epoch its steps, wall seconds (validation and checkpoints included) and peak memory; then one validation
    pass alone."""
    per_epoch, steps = [], 0
    for epoch in range(1, epochs + 1):
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        sync(device)
        start = time.perf_counter()
        state = m.train(model, train_batches, valid_batches, dataclasses.replace(cfg, epochs=epoch), device,
                        fingerprint)
        sync(device)
        per_epoch.append({"epoch": epoch, "steps": state.step - steps, "seconds": time.perf_counter() - start,
                          "train_loss": state.history["train_loss"][-1], "val_loss": state.history["val_loss"][-1],
                          **memory_mib(device)})
        steps = state.step
    start = time.perf_counter()
    m.validation_loss(model, valid_batches, device, cfg.label_smoothing)
    sync(device)
    return {"epochs": per_epoch, "skipped_steps": state.skipped_steps,
            "validation_s": time.perf_counter() - start,
            "target_tokens_per_epoch": sum(b.n_tokens for b in train_batches)}


def timed_decode(m, model, tokenizer, texts: list[str], cfg, device, beam: int = 1,
                 amp_dtype: torch.dtype | None = None) -> tuple[list[str], float]:
    """decode_corpus's outputs and seconds; with amp_dtype, under that autocast (the notebook decodes in fp32)."""
    sync(device)
    start = time.perf_counter()
    with torch.autocast(device.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
        hyps = m.decode_corpus(model, tokenizer, texts, cfg, device, beam)
    sync(device)
    return hyps, time.perf_counter() - start


def evaluation_timing(m, model, tokenizer, cfg, device, test: tuple[list, list], valid_src: list[str],
                      amp_dtype: torch.dtype | None) -> dict:
    """The decoding section 11 does, each kind once: greedy and beam on the test set, greedy on up to 1,000
    validation sentences, the sweep of section 11 (beams 1, 2, 4, 8 and its SWEEP_ALPHAS on the same sentences),
    and, with amp_dtype, greedy on the test set under autocast."""
    (test_src, test_ref), valid_src = test, valid_src[:1000]
    words = lambda lines: sum(len(line.split()) for line in lines)
    out = {"test_sentences": len(test_src), "valid_sentences": len(valid_src), "beam": cfg.beam_size}
    greedy, out["test_greedy_s"] = timed_decode(m, model, tokenizer, test_src, cfg, device)
    beam, out["test_beam_s"] = timed_decode(m, model, tokenizer, test_src, cfg, device, cfg.beam_size)
    out["test_greedy_bleu"] = round(m.corpus_bleu(greedy, test_ref)[0], 2)
    out["test_beam_bleu"] = round(m.corpus_bleu(beam, test_ref)[0], 2)
    out["output_words_per_reference_word"] = {"greedy": round(words(greedy) / words(test_ref), 3),
                                              "beam": round(words(beam) / words(test_ref), 3)}
    _, out["valid_greedy_s"] = timed_decode(m, model, tokenizer, valid_src, cfg, device)
    start = time.perf_counter()
    for b, alpha in m.SWEEP:  # section 11's sweep
        m.decode_corpus(model, tokenizer, valid_src, dataclasses.replace(cfg, length_penalty=alpha), device, b)
    sync(device)
    out["sweep_s"] = time.perf_counter() - start
    if amp_dtype is not None:
        amp, out["test_greedy_autocast_s"] = timed_decode(m, model, tokenizer, test_src, cfg, device, 1, amp_dtype)
        out["autocast"] = str(amp_dtype).replace("torch.", "")
        out["autocast_same_outputs"] = round(sum(a == b for a, b in zip(amp, greedy, strict=True)) / len(greedy), 4)
    return out




def sleep_seconds_per_cycle(device: torch.device) -> float:
    """What one cycle of torch.cuda._sleep takes on this GPU (the seconds of a long sleep, measured by CUDA events)."""
    cycles = 50_000_000
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1000)  # loaded before it is timed
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    sync(device)
    return start.elapsed_time(end) / 1e3 / cycles


def host_and_gpu_seconds(step, batches: list, device: torch.device, sleep_s: float) -> dict:
    """For each batch, step(batch) issued while the GPU is held busy by a sleep kernel of sleep_s seconds: the
    host's time to issue the step (wall clock), and the GPU's time to run its kernels back to back (CUDA events
    after the sleep). A host that issues slower than the sleep lasts (a step that waits for the GPU, or a full launch
    queue) is counted in `host_waited`: its GPU time then holds waits too. On a CPU: the host's time alone."""
    host, gpu, waited = [], [], 0
    per_cycle = sleep_seconds_per_cycle(device) if device.type == "cuda" else 0.0
    for batch in batches:
        sync(device)
        if device.type == "cuda":
            marks = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
            marks[0].record()
            torch.cuda._sleep(int(sleep_s / per_cycle))
            marks[1].record()
        start = time.perf_counter()
        step(batch)
        host.append(time.perf_counter() - start)
        if device.type == "cuda":
            marks[2].record()
            sync(device)
            gpu.append(marks[1].elapsed_time(marks[2]) / 1e3)
            waited += host[-1] > 0.9 * marks[0].elapsed_time(marks[1]) / 1e3
    return {"host_s": statistics.median(host), "gpu_s": statistics.median(gpu) if gpu else None,
            "host_waited": waited, "split_steps": len(batches)}


def attributed_time(groups: dict, kernels: float | None) -> float:
    """The profiled operators' own time (microseconds), refused when it is nothing on a GPU (kernels: the kernels'
    own time, None on a CPU): a profile without kernel time would make every share 0, and the projection wrong."""
    total = sum(groups.values())
    if kernels is not None and total <= 0:
        raise RuntimeError(f"the profiler attributed no kernel time to any operator (the kernels' own time: "
                           f"{kernels} µs): CUPTI may not have started; the step's split into matrix products and "
                           "the rest is unknown")
    return total or 1.0  # a CPU's profile of a step too short to time


def batch_size_row(m, cfg, device: torch.device, max_tokens: int, passes: int, max_batches: int | None = None,
                   profile_steps: int = 4) -> dict:
    """Phase 1 at one batch size: the preset's model, fresh and seeded, trained by the notebook's train_step on the
    first epoch's batches at max_tokens (at most max_batches of them): one untimed pass (every shape seen), `passes`
    timed passes, the host / GPU split of each batch, and profile_steps steps under the profiler."""
    from profile_step import GROUPS, grouped, product_flops, profiled

    epoch = m.make_batches(*m.data["train"], max_tokens, device.type == "cuda")
    order = m.epoch_order(len(epoch), cfg.seed, 0)
    batches = [epoch[i].to(device) for i in order][:max_batches]  # all of them on a GPU
    cfg = dataclasses.replace(cfg, max_tokens=max_tokens)
    m.seed_everything(cfg.seed)
    model = m.build_model(cfg, m.VOCAB).to(device).train()
    optimizer, scaler = m.make_optimizer(model, cfg), torch.amp.GradScaler(device.type)
    amp_dtype, done = m.autocast_dtype(device, cfg.amp), [0]

    def step(batch) -> None:
        done[0] += 1
        m.train_step(model, batch, optimizer, scaler, amp_dtype, cfg, done[0])

    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    for batch in batches:  # every batch shape seen once
        step(batch)
    sync(device)
    start = time.perf_counter()
    for _ in range(passes):
        for batch in batches:
            step(batch)
    sync(device)
    wall = time.perf_counter() - start
    step_s = wall / (passes * len(batches))
    split = host_and_gpu_seconds(step, batches, device, sleep_s=2 * step_s + 0.005)
    profile = batches[:profile_steps]

    def profiled_steps() -> None:
        for batch in profile:
            step(batch)
        sync(device)

    by_op, products, kernels = profiled(profiled_steps, m.VOCAB)
    groups = grouped(by_op)
    kernel_total = attributed_time(groups, kernels)
    tokens = sum(b.n_tokens for b in batches)
    return {"max_tokens": max_tokens, "steps_per_epoch": len(epoch), "epoch_target_tokens": sum(b.n_tokens for b in epoch),
            "target_tokens_per_step": round(tokens / len(batches), 1), "timed_steps": passes * len(batches),
            "step_s": step_s, "target_tokens_per_s": round(tokens * passes / wall, 1), **split,
            "profiled_ms_per_step": round(kernel_total / 1e3 / len(profile), 3),
            "kernel_ms_per_step": None if kernels is None else round(kernels / 1e3 / len(profile), 3),
            "matmul_share": groups[GROUPS[0]] / kernel_total,
            "groups_share": {g: round(groups[g] / kernel_total, 4) for g in GROUPS},
            "gflop_per_step": product_flops(products) / len(profile) / 1e9, **memory_mib(device)}


# ---------------------------------------------------------------------------------------------------------------------
# the phases


def run_benchmark(*args: str) -> dict:
    command = [sys.executable, str(TOOLS / "benchmark.py"), *args, "--json-only"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)  # time_limit stops it
    if done.returncode:
        raise RuntimeError(f"{' '.join(command[1:])} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return {"command": " ".join(["python", *command[1:]]), **benchmark_json(done.stdout)}


def notebook_module_on_hub_text(hub: Path, work: Path, preset: str = "iwslt14"):
    """The notebook's module (its cells, slow ones skipped) on `preset` (a dry run: smoke) whose data folder is the
    training folder made from the Hub's text in `hub` (iwslt14_training_folder: validation text as training data)."""
    data = iwslt14_training_folder(hub, work / "data")
    return load_notebook_module(preset, str(data), str(work / "run"))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    dry = args.dry_run
    if not torch.cuda.is_available() and not dry:
        print(NO_GPU)
        return 0
    ends_at = time.monotonic() + min(args.deadline_s, args.deadline_at - time.time())
    os.environ["TRANSFORMER_PROGRESS"] = "0"
    os.environ.setdefault("MPLBACKEND", "Agg")
    if torch.cuda.is_available():
        device, name = torch.device("cuda"), torch.cuda.get_device_name(0)
        about = {"capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
                 "memory_gib": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)}
    else:  # a dry run: one thread, as benchmark.py on a CPU (on a busy 2-core machine two make small ops wait)
        device, name, about = torch.device("cpu"), "cpu", {}
        torch.set_num_threads(1)
    path = results_path(args.out, f"{name} dry run" if dry else name)
    results = {"device": name, **about, "torch": torch.__version__, "commit": current_commit(), "dry_run": dry,
               "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "command": "python tests/tools/gpu_check.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    skip = set(filter(None, args.skip.split(",")))
    shared: dict = {}

    def phase(key: str, measure) -> None:
        if key in skip:
            return
        limit = min(math.inf if dry else PHASE_LIMITS_S[key], ends_at - time.monotonic())
        print(f"[gpu_check] {key} (limit {limit:.0f} s) ...", flush=True)
        start = time.perf_counter()
        try:
            if limit < 5:
                raise PhaseTimeout("not run: the deadline left no time for it")
            with time_limit(limit) if limit < math.inf else contextlib.nullcontext():
                results[key] = measure()
        except (Exception, PhaseTimeout) as error:  # noqa: BLE001 - one phase's failure must not lose the others
            results[key] = {"error": f"{type(error).__name__}: {error}"[:3000],
                            "traceback": traceback.format_exc()[-3000:], **shared.pop(f"{key} so far", {})}
        results[key]["wall_s"] = round(time.perf_counter() - start, 1)
        write_json(path, results)
        print(f"[gpu_check] {key} done in {results[key]['wall_s']} s" + (" (failed)" if "error" in results[key] else ""),
              flush=True)

    multi30k = find_folder(data_candidates("multi30k", args.multi30k_dir), ("train.de", "validation.de", "test.de"))
    hub = find_folder(data_candidates("iwslt14/hub", args.iwslt14_dir),
                      tuple(f"{s}.{lang}" for s in ("validation", "test") for lang in ("de", "en")))
    preset = "smoke" if dry else "iwslt14"
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)

        def module() -> object:
            """The notebook's module on the IWSLT14 text, loaded once for the phases that need it."""
            if "m" not in shared:
                if hub is None:
                    raise FileNotFoundError("no Hub-style IWSLT14 text found in " + ", ".join(
                        map(str, data_candidates("iwslt14/hub", args.iwslt14_dir))) + ": pass --iwslt14-dir")
                shared["m"] = notebook_module_on_hub_text(hub, work / "iwslt14", preset)
                shared["m"].model = None  # the cells' own model: out of the peak memory
            return shared["m"]

        def batch_sizes() -> dict:
            m = module()
            cfg, rows = m.cfg, []
            about_run = {"data": str(hub), "preset": preset, "train_pairs": len(m.corpus["train"][0]),
                         "autocast": str(m.autocast_dtype(device, cfg.amp)).replace("torch.", ""),
                         "preset_max_tokens": cfg.max_tokens, "time_budget_min": cfg.time_budget_min, "rows": rows}
            shared["batch_sizes so far"] = about_run  # what was measured, if a later size fails or runs out of time
            for size in DRY_BATCH_SIZES if dry else BATCH_SIZES:
                rows.append(batch_size_row(m, cfg, device, size, 1 if dry else args.passes, 2 if dry else None,
                                           1 if dry else 4))
                print(f"[gpu_check]   {size} tokens a batch: {rows[-1]['step_s'] * 1e3:.1f} ms a step, "
                      f"{rows[-1]['target_tokens_per_s']:,.0f} target tokens/s", flush=True)
                write_json(path, {**results, "batch_sizes": {**about_run, "partial": True}})  # if killed from outside
            return shared.pop("batch_sizes so far")

        phase("batch_sizes", batch_sizes)

        def projection() -> dict:
            measured = results.get("batch_sizes", {})
            if not measured.get("rows"):
                raise RuntimeError("phase batch_sizes measured nothing to project from")
            figures = published_figures(name) or (dict(T4, name="dry run: the T4's own figures") if dry else None)
            if figures is None:
                raise RuntimeError(f"no published figures for {name}: add it to PUBLISHED")
            ratio = IWSLT14_TRAIN_PAIRS / measured["train_pairs"]
            return {"what": "a projection, not a measurement: this GPU's step scaled to a T4 (see gpu_check.py); the "
                            "rest's time scaled by memory bandwidth, an upper bound where launches, not bytes, bound it",
                    "from_device": figures, "to_device": T4, "host_factors": list(HOST_FACTORS), "pairs_ratio": ratio,
                    "budget_min": measured["time_budget_min"],
                    "rows": t4_projection(measured["rows"], figures, ratio, measured["time_budget_min"])}

        phase("projection", projection)
        small = ["--steps", "2", "--rounds", "1", "--warmup", "0", "--sentences", "2"] if dry else ["--sentences", "300"]
        phase("benchmark", lambda: run_benchmark("--preset", "smoke" if dry else "multi30k", "--data-dir",
                                                 str(multi30k or TESTS / "data" / "multi30k"), *small))

        def iwslt14_train() -> dict:
            m = module()
            cfg = m.cfg
            if device.type == "cuda":
                torch.cuda.empty_cache()  # phase 1's models out of the peak memory
            m.seed_everything(cfg.seed)
            model = shared["model"] = m.build_model(cfg, m.VOCAB).to(device)
            amp_dtype = m.autocast_dtype(device, cfg.amp)
            fingerprint = m.model_fingerprint(cfg, m.corpus_fingerprint(m.corpus), model)
            pairs = len(m.corpus["train"][0])
            trained = train_epochs(m, model, cfg, m.train_batches, m.valid_batches, device, fingerprint, args.epochs)
            shared["weights"] = f"trained here, {args.epochs} epochs on {pairs:,} pairs (a weak model)"
            return {"data": str(hub), "preset": preset, "style": m.STYLE, "train_pairs": pairs, "vocab": m.VOCAB,
                    "parameters": sum(p.numel() for p in model.parameters()), "max_tokens": cfg.max_tokens,
                    "autocast": str(amp_dtype).replace("torch.", "") if amp_dtype else None,
                    "steps_per_epoch": len(m.train_batches),
                    **trained,
                    "projection": training_projection(trained["epochs"], trained["validation_s"], pairs,
                                                      cfg.time_budget_min)}

        phase("iwslt14_train", iwslt14_train)

        def evaluation() -> dict:
            m = module()
            cfg = m.cfg
            if "model" not in shared or "weights" not in shared:
                m.seed_everything(cfg.seed)
                shared["model"] = m.build_model(cfg, m.VOCAB).to(device)
                shared["weights"] = "untrained (they decode to the length limit: the times over-estimate)"
            test, valid = m.corpus["test"], m.corpus["validation"][0]
            if dry:
                test, valid = (test[0][:DRY_SENTENCES], test[1][:DRY_SENTENCES]), valid[:DRY_SENTENCES]
            timing = evaluation_timing(m, shared["model"], m.tokenizer, cfg, device, test, valid,
                                       m.autocast_dtype(device, cfg.amp))
            projection = results.get("iwslt14_train", {}).get("projection")
            files = None if projection is None else int(projection["epochs_in_budget"]) + cfg.average_last
            return {"weights": shared["weights"], **timing, "weight_files": files,
                    "estimated_evaluation_s": None if files is None else estimate_evaluation_s(timing, files)}

        phase("evaluation", evaluation)
        phase("memory", lambda: run_benchmark("--memory", preset))
    print(f"[gpu_check] wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
