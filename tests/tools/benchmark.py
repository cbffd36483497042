"""Speed benchmark: the notebook's Transformer against torch.nn.Transformer, in one process, on one device.

    python tests/tools/benchmark.py                       # no GPU: smoke preset, the repository's Multi30k slice, < 2 min
    python tests/tools/benchmark.py --preset multi30k     # on a GPU (the default preset there), bf16/fp16 autocast
    python tests/tools/benchmark.py --data-dir ''         # the preset's own data (downloads Multi30k / IWSLT14)
    python tests/tools/benchmark.py --preset cpu --data-dir /path/to/multi30k --threads 2   # the CPU preset's sizes

It loads the notebook's cells (tests/nbloader.py, slow cells skipped) and, with the same config and the same
batches, measures training tokens per second (target tokens, through the notebook's train_step, optimiser and
autocast) of the notebook's model and of an nn.Transformer of the same sizes (post-norm, no final norms, the same
tied and scaled embedding, sinusoidal positions and label-smoothed loss, started from the same weights); then
decoding sentences per second (greedy and beam, with and without the key/value cache; nn.Transformer has no cache)
and the peak GPU memory of each phase. It prints a table and one line `BENCHMARK_JSON {...}`.

Training is timed at steady state: both models stay on the device throughout (nothing moves between devices); the
batches of a round are --steps / --rounds batches of the first epoch's order (default 240 / 8 on a GPU: 30 a
round), the same in every round; each model first trains --warmup untimed passes over them (default 1: every batch
shape it is timed on has been seen, so that no timed step pays a shape's first sight); then each round times one
pass on one model, then on the other, the first alternating from round to round; each model keeps its own
optimiser, gradient scaler and random-number stream across rounds (its losses are those of training it alone). On a
shared machine the speed drifts: a round's two timings are close in time, so the per-round ratio notebook /
nn.Transformer is what to read. The table gives each model's median tokens/s over the rounds and the median ratio
with its spread (quartiles and min-max over rounds); BENCHMARK_JSON has them under train (ratio_median, ratio_q1,
ratio_q3, ratio_min, ratio_max, ratio_of_totals, ratios, rounds, steps_per_round; per model tokens_per_s = the
median, tokens_per_s_rounds). Peak memory is read with both models and their optimisers on the device.
nn.Transformer(dropout=p), built as a user would, also drops attention weights and the feed-forward's hidden units,
which the notebook's model (attention_dropout 0, as in the paper) does not: its training steps do more dropouts.
Both models train on the same batches (on a CPU padded only to their longest sentence, section 4 of the notebook).

    python tests/tools/benchmark.py --memory iwslt14      # training memory of a preset at its max_tokens, any device

--memory answers "does this preset fit on a T4?" without needing the preset's data or a T4: it builds the preset's
model (vocabulary: the preset's vocab_size) and runs one training step on the batch shapes make_batches can produce
at the preset's max_tokens (few long sentences, many short ones), under fp16 autocast (bf16, the same width, on a
CPU, where it runs only the forward pass: low-precision matrix products are slow there). It counts the bytes of the
training state (fp32 weights, gradients and Adam's two moments) and of every tensor saved for backward (unique
storages, through torch.autograd.graph.saved_tensors_hooks), and on a GPU also reads the real peak allocation.
Both models decode with the same untrained initial weights, so their outputs are identical and run to about the
length limit (source length + max_extra_len): the table gives the mean output length. Without a GPU torch runs
on one thread (--threads): on a busy 2-core machine two threads made every small op wait ~10 ms.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import platform
import re
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # common.py beside this file
from common import load_notebook_module, sync

CUDA = torch.cuda.is_available()
warnings.filterwarnings("ignore", message="The PyTorch API of nested tensors")  # nn.Transformer's inference path


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", help="notebook preset (default: multi30k on a GPU, smoke without one)")
    p.add_argument("--data-dir", default="tests/data/multi30k",
                   help="folder of {train,validation,test}.{de,en}; '' for the preset's own data")
    p.add_argument("--work-dir", help="where the notebook keeps its BPE (default: a temporary folder)")
    p.add_argument("--steps", type=int, help="timed training steps per model, over all rounds (default 240 on a GPU, "
                   "50 on a CPU)")
    p.add_argument("--rounds", type=int, help="training is timed in this many rounds of steps / rounds steps per "
                   "model, the same batches each round, alternating models (default 8 on a GPU, 5 on a CPU)")
    p.add_argument("--warmup", type=int, default=1, help="untimed passes over a round's batches before the rounds "
                   "(default 1: every timed batch shape seen once)")
    p.add_argument("--sentences", type=int, help="test sentences to decode (default 500 / 24)")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--max-tokens", type=int, help="override the preset's padded tokens per training batch")
    p.add_argument("--no-amp", action="store_true", help="train in fp32 on a GPU too")
    p.add_argument("--amp-decode", action="store_true",
                   help="decode under training's autocast dtype (the notebook's decode_corpus decodes in fp32)")
    p.add_argument("--threads", type=int, help="torch CPU threads (default 1 without a GPU: the small model gains "
                   "nothing from more, and on a busy machine every multi-threaded op waits; 0: torch's choice)")
    p.add_argument("--memory", metavar="PRESET",
                   help="instead of the speed benchmark: training memory of PRESET at its max_tokens (see above)")
    p.add_argument("--json-only", action="store_true", help="print only the BENCHMARK_JSON line")
    return p.parse_args()


class TorchTransformer(nn.Module):
    """nn.Transformer with the notebook model's sizes, embedding, positions, tied output and encode/decode API
    (so the notebook's train_step, greedy_decode and beam_search run it, without a cache)."""

    def __init__(self, m, cfg, vocab: int):
        super().__init__()
        self.d_model, self.pad_id = cfg.d_model, m.PAD
        self.embedding = nn.Embedding(vocab, cfg.d_model, padding_idx=m.PAD)
        self.register_buffer("positions", m.sinusoidal_positions(cfg.max_positions, cfg.d_model), persistent=False)
        self.embed_dropout = nn.Dropout(cfg.dropout)
        self.core = nn.Transformer(cfg.d_model, cfg.n_heads, cfg.encoder_layers, cfg.decoder_layers, cfg.d_ff,
                                   cfg.dropout, batch_first=True, norm_first=False)
        self.core.encoder.norm = nn.Identity()  # the paper's post-norm stacks end with their last layer's norm
        self.core.decoder.norm = nn.Identity()

    @property
    def max_positions(self) -> int:
        """The longest sequence the positional table covers (the decoders check lengths against it)."""
        return self.positions.size(0)

    def embed(self, tokens):
        x = self.embedding(tokens) * math.sqrt(self.d_model)
        return self.embed_dropout(x + self.positions[: tokens.size(1)])

    def encode(self, src):
        pad = src == self.pad_id
        return self.core.encoder(self.embed(src), src_key_padding_mask=pad), pad

    def decode(self, tgt_in, memory, pad, cache=None):
        """Logits (B, T, V)."""
        assert cache is None, "nn.Transformer has no key/value cache"
        causal = torch.ones(tgt_in.size(1), tgt_in.size(1), dtype=torch.bool, device=tgt_in.device).triu(1)
        y = self.core.decoder(self.embed(tgt_in), memory, tgt_mask=causal, memory_key_padding_mask=pad,
                              tgt_is_causal=True)
        return F.linear(y, self.embedding.weight)

    def forward(self, src, tgt_in):
        return self.decode(tgt_in, *self.encode(src))


NORMS = {"encoder": {"residual_attn": "norm1", "residual_ff": "norm2"},
         "decoder": {"residual_self": "norm1", "residual_cross": "norm2", "residual_ff": "norm3"}}


def torch_state(state: dict) -> dict:
    """The notebook model's state dict under TorchTransformer's parameter names."""
    out = {}
    for key, value in state.items():
        stack = key.split(".")[0]
        if stack in NORMS:
            key = re.sub(r"^(encoder|decoder)\.", r"core.\1.layers.", key).replace("feed_forward.", "")
            key = key.replace("in_proj.", "in_proj_").replace("cross_attn", "multihead_attn")
            for ours, theirs in NORMS[stack].items():
                key = key.replace(f"{ours}.norm", theirs)
        out[key] = value
    return out


def reset_peak():
    sync()
    if CUDA:
        torch.cuda.reset_peak_memory_stats()


def peak_mib():
    return round(torch.cuda.max_memory_allocated() / 2**20, 1) if CUDA else None


def rng_state() -> tuple:
    return torch.get_rng_state(), torch.cuda.get_rng_state() if CUDA else None


def set_rng_state(state: tuple) -> None:
    torch.set_rng_state(state[0])
    if CUDA:
        torch.cuda.set_rng_state(state[1])


def time_training(m, models: dict, cfg, batches: list, warmup_passes: int, rounds: int, device) -> dict:
    """Target tokens per second of each model at steady state, timed in alternation: both models stay on the device
    throughout (nothing moves between devices); each first trains `warmup_passes` untimed passes over `batches`, so
    that every batch shape it is timed on has been seen; then `rounds` rounds, each timing one pass over the same
    `batches` on one model, then on the other (the first alternating). Each model keeps its optimiser, scaler and
    random-number stream (seeded with cfg.seed, as if trained alone) from round to round. The per-round ratio
    (first model / second) is what to read: a round's two timings are close in time."""
    amp_dtype = m.autocast_dtype(device, cfg.amp)
    runs = {}

    def steps(who: str, first_step: int) -> float:
        """Seconds for train_step on `batches`, steps numbered from first_step."""
        run = runs[who]
        set_rng_state(run["rng"])
        reset_peak()
        start = time.perf_counter()
        for step, batch in enumerate(batches, first_step):
            run["losses"].append(m.train_step(run["model"], batch, run["optimizer"], run["scaler"],
                                              amp_dtype, cfg, step))
        sync()
        seconds = time.perf_counter() - start
        run["rng"], run["peak"] = rng_state(), max(run["peak"], peak_mib() or 0)
        return seconds

    for who, model in models.items():
        model.to(device).train()  # on the device before its (fused) Adam is made
        m.seed_everything(cfg.seed)
        runs[who] = {"model": model, "optimizer": m.make_optimizer(model, cfg), "rng": rng_state(),
                     "scaler": torch.amp.GradScaler(device.type), "peak": 0, "losses": [], "seconds": [], "tokens_per_s": []}
    done = 0
    for _ in range(warmup_passes):
        for who in models:
            steps(who, done + 1)
        done += len(batches)
    for run in runs.values():
        run.update(peak=0, losses=[])  # untimed
    tokens = sum(b.n_tokens for b in batches)
    for r in range(rounds):
        for who in (list(models) if r % 2 == 0 else list(models)[::-1]):
            seconds = steps(who, done + 1)
            runs[who]["seconds"].append(seconds)
            runs[who]["tokens_per_s"].append(tokens / seconds)
        done += len(batches)
    out = {}
    for who, run in runs.items():
        losses = torch.stack(run["losses"])  # summed losses; a non-finite one: a step the scaler skipped
        finite = losses.isfinite()
        out[who] = {"tokens_per_s": round(statistics.median(run["tokens_per_s"]), 1),
                    "tokens_per_s_rounds": [round(x, 1) for x in run["tokens_per_s"]],
                    "seconds": round(sum(run["seconds"]), 3), "peak_mib": run["peak"] if CUDA else None,
                    "loss_per_token": round(float(losses[finite].sum()) / (tokens * rounds), 4),
                    "skipped_steps": int((~finite).sum())}
    names = list(models)
    ratios = [a / b for a, b in zip(runs[names[0]]["tokens_per_s"], runs[names[1]]["tokens_per_s"])]
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    return {**out, "rounds": rounds, "steps_per_round": len(batches), "warmup_passes": warmup_passes,
            "ratios": [round(x, 3) for x in ratios], "ratio_median": round(statistics.median(ratios), 3),
            "ratio_q1": round(quartiles[0], 3), "ratio_q3": round(quartiles[2], 3),
            "ratio_min": round(min(ratios), 3), "ratio_max": round(max(ratios), 3),
            "ratio_of_totals": round(sum(runs[names[1]]["seconds"]) / sum(runs[names[0]]["seconds"]), 3)}


def decode_chunks(m, cfg, ids: list, beam: int, device) -> list:
    """The source sentences, padded, in the notebook's decode_corpus chunks (length_sorted_chunks)."""
    chunks = m.length_sorted_chunks([len(x) for x in ids], beam, cfg)
    return [m.pad([ids[i] for i in chunk], max(len(ids[i]) for i in chunk)).to(device) for chunk in chunks]


def time_decoding(m, model, cfg, chunks: list, beam: int, use_cache: bool, autocast) -> tuple[dict, list]:
    """Sentences per second of greedy_decode (beam 1) or beam_search over the chunks; also the outputs."""
    def run(src, max_extra):
        if beam == 1:
            return m.greedy_decode(model, src, max_extra, use_cache)
        return m.beam_search(model, src, beam, cfg.length_penalty, max_extra, use_cache)

    with autocast():
        run(chunks[0][:2], 2)  # warm-up
        reset_peak()
        start, hyps = time.perf_counter(), []
        for src in chunks:
            hyps += run(src, cfg.max_extra_len)
        sync()
    seconds = time.perf_counter() - start
    return {"sentences_per_s": round(len(hyps) / seconds, 2), "seconds": round(seconds, 3), "peak_mib": peak_mib(),
            "mean_output_tokens": round(sum(map(len, hyps)) / len(hyps), 1)}, hyps


AMP_FOR_MEMORY = {"cuda": torch.float16, "cpu": torch.bfloat16}  # a T4's dtype; on a CPU bf16, of the same width


def saved_for_backward_bytes(function, *args) -> tuple[int, object]:
    """Bytes of the distinct storages autograd keeps for the backward pass of function(*args); its result."""
    storages = {}

    def pack(t):
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        result = function(*args)
    return sum(storages.values()), result


def measure_memory(m, preset: str, device) -> dict:
    """Training memory of `preset` at its max_tokens: state, activations saved for backward, GPU peak."""
    cfg = dataclasses.replace(m.Config(), preset=preset, **m.PRESETS[preset])
    m.seed_everything(cfg.seed)
    model = m.build_model(cfg, cfg.vocab_size).to(device).train()
    optimizer = m.make_optimizer(model, cfg)
    scaler = torch.amp.GradScaler(device.type)

    def batch_of(rows: int, length: int):
        g = torch.Generator().manual_seed(0)
        src = torch.randint(len(m.SPECIALS), cfg.vocab_size, (rows, length), generator=g)
        tgt = torch.randint(len(m.SPECIALS), cfg.vocab_size, (rows, length + 1), generator=g)
        return m.Batch(src, tgt[:, :-1].contiguous(), tgt[:, 1:].contiguous(), rows * length).to(device)

    m.train_step(model, batch_of(2, 8), optimizer, scaler, None, cfg, 1)  # creates Adam's moments
    state = sum(t.numel() * t.element_size() for t in model.parameters()) * 2  # weights and their gradients
    state += sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values() if t.dim())
    cases = []
    for length in (m.round_up(cfg.max_len), 32, 8):  # the padded length of a batch's longest sentence
        rows = cfg.max_tokens // length
        batch = batch_of(rows, length)
        reset_peak()
        with torch.autocast(device.type, dtype=AMP_FOR_MEMORY[device.type]):
            saved, logits = saved_for_backward_bytes(model, batch.src, batch.tgt_in)
        saved_loss, (loss, _) = saved_for_backward_bytes(m.label_smoothed_loss, logits, batch.tgt_out,
                                                         cfg.label_smoothing)
        if CUDA:  # the rest of a real step, for the true peak (on a CPU only the forward pass: it is slow in fp16)
            scaler.scale(loss / batch.n_tokens).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
        del logits, loss
        sync()
        cases.append({"batch": [rows, length], "saved_for_backward_mib": round((saved + saved_loss) / 2**20, 1),
                      "model_saved_mib": round(saved / 2**20, 1), "loss_saved_mib": round(saved_loss / 2**20, 1),
                      "logits_fp32_mib": round(rows * length * cfg.vocab_size * 4 / 2**20, 1),
                      "gpu_peak_mib": peak_mib()})
    worst = max(c["saved_for_backward_mib"] + 2 * c["logits_fp32_mib"] for c in cases)
    return {"preset": preset, "parameters": sum(p.numel() for p in model.parameters()), "max_tokens": cfg.max_tokens,
            "vocab_size": cfg.vocab_size, "autocast": str(AMP_FOR_MEMORY[device.type]).replace("torch.", ""),
            "training_state_mib": round(state / 2**20, 1), "cases": cases,
            "estimate_mib": round(state / 2**20 + worst, 1)}


def print_memory(info: dict) -> None:
    print(f"\n{info['device']}, torch {info['torch']}: preset {info['preset']}, {info['parameters']:,} parameters, "
          f"vocabulary {info['vocab_size']:,}, max_tokens {info['max_tokens']}, {info['autocast']} autocast\n")
    print(f"training state (fp32 weights, gradients, Adam moments): {info['training_state_mib']} MiB\n")
    print("| batch (sentences x padded length) | saved for backward (MiB): model + loss | fp32 logits (MiB) | GPU peak (MiB) |")
    print("| --- | ---: | ---: | ---: |")
    for c in info["cases"]:
        print(f"| {c['batch'][0]} x {c['batch'][1]} | {c['saved_for_backward_mib']}: {c['model_saved_mib']} + "
              f"{c['loss_saved_mib']} | {c['logits_fp32_mib']} | "
              f"{'-' if c['gpu_peak_mib'] is None else c['gpu_peak_mib']} |")
    print(f"\nestimate: state + saved activations + two fp32 logit-sized temporaries = {info['estimate_mib']} MiB\n")


def main():
    args = parse_args()
    threads = args.threads if args.threads is not None else (0 if CUDA else 1)
    default_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    if args.memory:
        with tempfile.TemporaryDirectory() as tmp:
            m = load_notebook_module("smoke", "tests/data/multi30k", tmp)
        if args.memory not in m.PRESETS:
            sys.exit(f"--memory: unknown preset {args.memory!r}; choose one of {', '.join(m.PRESETS)}")
        info = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "torch": torch.__version__,
                "device": torch.cuda.get_device_name(0) if CUDA else f"CPU {platform.machine()}",
                **measure_memory(m, args.memory, m.device)}
        if not args.json_only:
            print_memory(info)
        print("BENCHMARK_JSON " + json.dumps(info))
        return
    preset = args.preset or ("multi30k" if CUDA else "smoke")
    steps, rounds, warmup = args.steps or (240 if CUDA else 50), args.rounds or (8 if CUDA else 5), args.warmup
    if not 1 <= rounds <= steps:
        sys.exit(f"--rounds {rounds}: need 1 <= rounds <= steps ({steps})")
    steps -= steps % rounds  # whole rounds
    wall = time.perf_counter()
    torch.set_num_threads(1)  # the notebook's cells train a toy model: many small ops, each slower on 2 busy threads
    with tempfile.TemporaryDirectory() as tmp:
        m = load_notebook_module(preset, args.data_dir, args.work_dir or tmp)
    torch.set_num_threads(threads or default_threads)
    load_s = time.perf_counter() - wall
    cfg = dataclasses.replace(m.cfg, amp=m.cfg.amp and not args.no_amp, max_tokens=args.max_tokens or m.cfg.max_tokens)
    device = m.device
    amp_dtype = m.autocast_dtype(device, cfg.amp)

    # the same batches for both models: the first epoch's shuffled order, cycled, moved to the device beforehand
    batches = m.make_batches(*m.data["train"], cfg.max_tokens, device.type == "cuda")
    order = m.epoch_order(len(batches), cfg.seed, 0)
    schedule = [batches[order[j % len(batches)]].to(device) for j in range(steps // rounds)]  # one round's

    m.model = None  # the notebook's own instance: out of the peak memory
    m.seed_everything(cfg.seed)
    ours = m.build_model(cfg, m.VOCAB).to(device)
    theirs = TorchTransformer(m, cfg, m.VOCAB).to(device)
    initial = {k: v.detach().cpu().clone() for k, v in ours.state_dict().items()}
    theirs.load_state_dict(torch_state(initial))  # strict: both have exactly the same parameters
    n_params = sum(p.numel() for p in ours.parameters())
    with torch.no_grad():
        b = schedule[0]
        logit_diff = (ours.eval()(b.src, b.tgt_in) - theirs.eval()(b.src, b.tgt_in)).abs().max().item()

    models = {"notebook": ours, "torch": theirs}

    train = time_training(m, models, cfg, schedule, warmup, rounds, device)

    # a few steps teach a model to say <eos> at once; untrained weights rarely do, so decoding does real work
    ours.load_state_dict(initial)
    theirs.load_state_dict(torch_state(initial))
    ids = m.data["test"][0][: args.sentences or (500 if CUDA else 24)]

    def autocast():
        enabled = bool(args.amp_decode and amp_dtype)
        return torch.autocast(device.type, dtype=amp_dtype or torch.float32, enabled=enabled)

    decode = {}
    for beam in (1, args.beam):
        name, chunks = ("greedy" if beam == 1 else f"beam{beam}"), decode_chunks(m, cfg, ids, beam, device)
        cached, reference = time_decoding(m, ours, cfg, chunks, beam, True, autocast)
        decode[f"{name}_cache"], decode[f"{name}_no_cache"] = {"notebook": cached}, {}
        for who, model in models.items():
            result, hyps = time_decoding(m, model, cfg, chunks, beam, False, autocast)
            same = sum(a == b for a, b in zip(hyps, reference, strict=True))
            decode[f"{name}_no_cache"][who] = {**result, "same_outputs_as_cache": round(same / len(hyps), 3)}

    info = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": torch.cuda.get_device_name(0) if CUDA else f"CPU {platform.processor() or platform.machine()}",
        "torch": torch.__version__, "threads": torch.get_num_threads(), "preset": preset, "data_dir": cfg.data_dir,
        "amp": str(amp_dtype).replace("torch.", "") if amp_dtype else None,
        "decode_amp": bool(args.amp_decode and amp_dtype),
        "config": {k: getattr(cfg, k, None) for k in ("vocab_size", "d_model", "n_heads", "d_ff", "encoder_layers",
                                                      "decoder_layers", "dropout", "attention_dropout", "max_tokens",
                                                      "max_extra_len")},
        "vocab": m.VOCAB, "parameters": n_params, "max_abs_logit_diff_same_weights": logit_diff,
        "train_steps": steps, "warmup_passes": warmup, "test_sentences": len(ids), "load_s": round(load_s, 1),
        "train": train, "decode": decode,
    }
    info["total_s"] = round(time.perf_counter() - wall, 1)
    if not args.json_only:
        print_table(info)
    print("BENCHMARK_JSON " + json.dumps(info))


def print_table(info: dict) -> None:
    def fmt(x):
        return "-" if x is None else f"{x:,.1f}" if isinstance(x, float) else str(x)

    def row(what, ours, theirs, note="", ratio=None):
        ratio = ratio or (f"{ours / theirs:.2f}" if ours and theirs else "-")
        print(f"| {what} | {fmt(ours)} | {fmt(theirs)} | {ratio} | {note} |")

    c, t = info["config"], info["train"]
    print(f"\n{info['device']}, torch {info['torch']}, threads: {info['threads']}, preset {info['preset']}: "
          f"d_model {c['d_model']}, {c['n_heads']} heads, d_ff {c['d_ff']}, "
          f"{c['encoder_layers']}+{c['decoder_layers']} layers, vocab {info['vocab']:,}, "
          f"{info['parameters']:,} parameters, max_tokens {c['max_tokens']}, amp {info['amp']}, "
          f"decode amp {info['decode_amp']}; same weights: max |logit difference| "
          f"{info['max_abs_logit_diff_same_weights']:.1e}\n")
    print("| measure | notebook | nn.Transformer | notebook / nn.Transformer | notes |")
    print("| --- | ---: | ---: | ---: | --- |")
    row(f"training tokens/s (median of {t['rounds']} rounds of {t['steps_per_round']} steps)",
        t["notebook"]["tokens_per_s"], t["torch"]["tokens_per_s"],
        f"per-round ratios {', '.join(f'{x:.2f}' for x in t['ratios'])}; "
        f"loss/token {t['notebook']['loss_per_token']} / {t['torch']['loss_per_token']}",
        f"{t['ratio_median']:.2f} (quartiles {t['ratio_q1']:.2f}-{t['ratio_q3']:.2f}, "
        f"range {t['ratio_min']:.2f}-{t['ratio_max']:.2f})")
    row("training peak memory (MiB)", t["notebook"]["peak_mib"], t["torch"]["peak_mib"])
    for name, r in info["decode"].items():
        ours, theirs = r["notebook"], r.get("torch", {})
        note = f"{ours['mean_output_tokens']} tokens/sentence, peak MiB {fmt(ours['peak_mib'])}"
        if theirs:
            note += f" / {fmt(theirs['peak_mib'])}; same outputs as with the cache: " \
                    f"{ours['same_outputs_as_cache']:.0%} / {theirs['same_outputs_as_cache']:.0%}"
        row(f"{name.replace('_', ' ')}: sentences/s ({info['test_sentences']})", ours["sentences_per_s"],
            theirs.get("sentences_per_s"), note)
    extra = (1 + (c["attention_dropout"] != c["dropout"]), 1 + 2 * (c["attention_dropout"] != c["dropout"]))
    print(f"\ntraining ratio: median of the per-round ratios (quartiles and min-max over rounds). Dropout differs: the notebook's "
          f"model drops attention weights at {c['attention_dropout']} and has none inside its feed-forward (as in the "
          f"paper); nn.Transformer(dropout={c['dropout']}) drops attention weights and the feed-forward's hidden units "
          f"at {c['dropout']}: {extra[0]} more dropout(s) per encoder layer, {extra[1]} per decoder layer.")
    print(f"\nloading the notebook {info['load_s']}s, everything {info['total_s']}s\n")


if __name__ == "__main__":
    main()
