"""Speed benchmark: the notebook's Transformer against torch.nn.Transformer, in one process, on one device.

    python tests/benchmark.py                       # no GPU: smoke preset, the repository's Multi30k slice, < 2 min
    python tests/benchmark.py --preset multi30k     # on a GPU (the default preset there), bf16/fp16 autocast
    python tests/benchmark.py --data-dir ''         # the preset's own data (downloads Multi30k / IWSLT14)

It loads the notebook's cells (tests/nbloader.py, slow cells skipped) and, with the same config and the same
batches, measures training tokens per second (target tokens, through the notebook's train_step, optimiser and
autocast) of the notebook's model and of an nn.Transformer of the same sizes (post-norm, no final norms, same
tied and scaled embedding, sinusoidal positions and label-smoothed loss, started from the same weights), then
decoding sentences per second (greedy and beam, with and without the key/value cache; nn.Transformer has no
cache and gets the notebook's trained weights, so both decode the same outputs) and peak GPU memory of each
phase. It prints a table and one line `BENCHMARK_JSON {...}`. The models are barely trained, so outputs run
to about the length limit (source + max_extra_len): the table gives the mean output length.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import io
import json
import os
import platform
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", help="notebook preset (default: multi30k on a GPU, smoke without one)")
    p.add_argument("--data-dir", default="tests/data/multi30k", help="folder of {train,validation,test}.{de,en}; "
                   "'' for the preset's own data")
    p.add_argument("--work-dir", help="where the notebook keeps its BPE (default: a temporary folder)")
    p.add_argument("--steps", type=int, help="timed training steps per model (default 100 on a GPU, 20 on a CPU)")
    p.add_argument("--warmup", type=int, help="untimed training steps before them (default 10 / 3)")
    p.add_argument("--sentences", type=int, help="test sentences to decode (default 500 / 24)")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--max-tokens", type=int, help="override the preset's padded tokens per training batch")
    p.add_argument("--no-amp", action="store_true", help="train in fp32 on a GPU too")
    p.add_argument("--decode-amp", action="store_true", help="decode under autocast (the notebook decodes in fp32)")
    p.add_argument("--json-only", action="store_true", help="print only the BENCHMARK_JSON line")
    return p.parse_args()


def load_notebook_module(preset: str, data_dir: str, work_dir: str):
    """The notebook's definitions for `preset`, its output swallowed (shown only if loading fails)."""
    import matplotlib

    matplotlib.use("Agg")
    os.environ.update(TRANSFORMER_PRESET=preset, TRANSFORMER_WORK_DIR=work_dir)
    if data_dir:
        os.environ["TRANSFORMER_DATA_DIR"] = str(Path(data_dir).resolve())
    else:
        os.environ.pop("TRANSFORMER_DATA_DIR", None)
    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT / "tests"))
    from nbloader import load_notebook

    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            module = load_notebook()
    except BaseException:
        print(log.getvalue()[-5000:], file=sys.stderr)
        raise
    import matplotlib.pyplot as plt

    plt.close("all")
    return module


def main():
    args = parse_args()
    import torch
    import torch.nn.functional as F
    from torch import nn

    cuda = torch.cuda.is_available()
    preset = args.preset or ("multi30k" if cuda else "smoke")
    steps, warmup = args.steps or (100 if cuda else 20), args.warmup if args.warmup is not None else (10 if cuda else 3)
    n_sentences = args.sentences or (500 if cuda else 24)
    wall = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        m = load_notebook_module(preset, args.data_dir, args.work_dir or tmp)
    overrides = {"max_tokens": args.max_tokens} if args.max_tokens else {}
    cfg = dataclasses.replace(m.cfg, amp=not args.no_amp and m.cfg.amp, **overrides)
    device = m.device
    amp_dtype, _ = m.amp_settings(device, cfg.amp)
    load_s = time.perf_counter() - wall

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def reset_peak():
        sync()
        if cuda:
            torch.cuda.reset_peak_memory_stats()

    def peak_mib():
        return round(torch.cuda.max_memory_allocated() / 2**20, 1) if cuda else None

    class TorchTransformer(nn.Module):
        """nn.Transformer with the notebook model's sizes, embedding, positions, tied output and encode/decode API."""

        def __init__(self):
            super().__init__()
            self.d_model = cfg.d_model
            self.embedding = nn.Embedding(m.VOCAB, cfg.d_model, padding_idx=m.PAD)
            self.register_buffer("positions", m.sinusoidal_positions(cfg.max_positions, cfg.d_model), persistent=False)
            self.embed_dropout = nn.Dropout(cfg.dropout)
            self.core = nn.Transformer(cfg.d_model, cfg.n_heads, cfg.encoder_layers, cfg.decoder_layers, cfg.d_ff,
                                       cfg.dropout, batch_first=True, norm_first=False)
            self.core.encoder.norm = nn.Identity()  # the paper's post-norm stack ends with the last layer's norm
            self.core.decoder.norm = nn.Identity()

        def embed(self, tokens):
            x = self.embedding(tokens) * self.d_model ** 0.5
            return self.embed_dropout(x + self.positions[: tokens.size(1)])

        def encode(self, src):
            pad = src == m.PAD
            return self.core.encoder(self.embed(src), src_key_padding_mask=pad), pad

        def decode(self, tgt_in, memory, pad, cache=None):
            assert cache is None, "nn.Transformer has no key/value cache"
            T = tgt_in.size(1)
            causal = torch.ones(T, T, dtype=torch.bool, device=tgt_in.device).triu(1)  # True: not allowed
            y = self.core.decoder(self.embed(tgt_in), memory, tgt_mask=causal, memory_key_padding_mask=pad,
                                  tgt_is_causal=True)
            return F.linear(y, self.embedding.weight)

        def forward(self, src, tgt_in):
            return self.decode(tgt_in, *self.encode(src))

    norm_names = {"encoder": {"residual_attn": "norm1", "residual_ff": "norm2"},
                  "decoder": {"residual_self": "norm1", "residual_cross": "norm2", "residual_ff": "norm3"}}

    def torch_state(notebook_state: dict) -> dict:
        """The notebook model's state dict under TorchTransformer's parameter names."""
        out = {}
        for key, value in notebook_state.items():
            stack = key.split(".")[0]
            if stack in norm_names:
                key = re.sub(r"^(encoder|decoder)\.", r"core.\1.layers.", key)
                key = key.replace("in_proj.weight", "in_proj_weight").replace("in_proj.bias", "in_proj_bias")
                key = key.replace("cross_attn", "multihead_attn").replace("feed_forward.", "")
                for ours, theirs in norm_names[stack].items():
                    key = key.replace(f"{ours}.norm", theirs)
            out[key] = value
        return out

    # the same batches for both models: the first epoch's shuffled order, cycled
    batches = m.make_batches(*m.data["train"], cfg.max_tokens)
    order = m.epoch_order(len(batches), cfg.seed, 0)
    used = {i: batches[i].to(device) for i in {order[j % len(order)] for j in range(warmup + steps)}}
    schedule = [used[order[j % len(order)]] for j in range(warmup + steps)]

    m.seed_everything(cfg.seed)
    ours = m.build_model(cfg, m.VOCAB).to(device)
    theirs = TorchTransformer().to(device)
    theirs.load_state_dict(torch_state(ours.state_dict()))  # strict: the two have exactly the same parameters
    n_params = sum(p.numel() for p in ours.parameters())
    assert n_params == sum(p.numel() for p in theirs.parameters())
    with torch.no_grad():
        b = schedule[0]
        same = (ours.eval()(b.src, b.tgt_in) - theirs.eval()(b.src, b.tgt_in)).abs().max().item()

    def time_training(model):
        m.seed_everything(cfg.seed)
        model.train()
        optimizer = m.make_optimizer(model, cfg)
        _, scaler = m.amp_settings(device, cfg.amp)
        for step, batch in enumerate(schedule[:warmup], 1):
            m.train_step(model, model, batch, optimizer, scaler, amp_dtype, cfg, step)
        reset_peak()
        start, losses, tokens = time.perf_counter(), [], 0
        for step, batch in enumerate(schedule[warmup:], warmup + 1):
            losses.append(m.train_step(model, model, batch, optimizer, scaler, amp_dtype, cfg, step))
            tokens += batch.n_tokens
        sync()
        seconds = time.perf_counter() - start
        finite = [x for x in losses if x is not None]
        return {"tokens_per_s": round(tokens / seconds, 1), "seconds": round(seconds, 3), "peak_mib": peak_mib(),
                "loss_per_token": round(float(sum(finite)) / tokens, 4) if finite else None,
                "skipped_steps": len(losses) - len(finite)}

    train = {"notebook": time_training(ours), "torch": time_training(theirs)}
    theirs.load_state_dict(torch_state(ours.state_dict()))  # decode the same outputs as the notebook's model

    # decoding: test sentences in length-sorted chunks, cut like the notebook's decode_corpus
    ids = m.data["test"][0][:n_sentences]

    def chunks(beam):
        order, out, start = sorted(range(len(ids)), key=lambda i: len(ids[i])), [], 0
        while start < len(order):
            end = start + 1
            while end < len(order) and (end - start + 1) * beam * (len(ids[order[end]]) + cfg.max_extra_len) \
                    <= cfg.decode_max_tokens:
                end += 1
            group = [ids[i] for i in order[start:end]]
            out.append(m.pad(group, max(map(len, group))).to(device))
            start = end
        return out

    autocast = torch.autocast(device.type, dtype=amp_dtype or torch.float32, enabled=args.decode_amp and bool(amp_dtype))

    def time_decoding(model, beam, use_cache):
        def run(src, extra):
            if beam == 1:
                return m.greedy_decode(model, src, extra, use_cache)
            return m.beam_search(model, src, beam, cfg.length_penalty, extra, use_cache)

        srcs = chunks(beam)
        with autocast:
            run(srcs[0][:2], 2)  # warm-up
            reset_peak()
            start, hyps = time.perf_counter(), []
            for src in srcs:
                hyps += run(src, cfg.max_extra_len)
            sync()
        seconds = time.perf_counter() - start
        return {"sentences_per_s": round(len(hyps) / seconds, 2), "seconds": round(seconds, 3), "peak_mib": peak_mib(),
                "mean_output_tokens": round(sum(map(len, hyps)) / len(hyps), 1), "hyps": hyps}

    decode = {}
    for beam in (1, args.beam):
        name = "greedy" if beam == 1 else f"beam{beam}"
        decode[f"{name}_cache"] = {"notebook": time_decoding(ours, beam, True)}
        decode[f"{name}_no_cache"] = {"notebook": time_decoding(ours, beam, False), "torch": time_decoding(theirs, beam, False)}
    for name, row in decode.items():  # the same outputs with and without the cache, and from nn.Transformer?
        reference = decode[name.replace("_no_cache", "_cache")]["notebook"]["hyps"]
        for result in row.values():
            result["same_outputs_as_cache"] = round(sum(a == b for a, b in zip(result["hyps"], reference)) / len(ids), 3)
    for row in decode.values():
        for result in row.values():
            del result["hyps"]

    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(0) if cuda else f"CPU {platform.processor() or platform.machine()}",
        "torch": torch.__version__, "threads": torch.get_num_threads(), "preset": preset, "data_dir": cfg.data_dir,
        "amp": str(amp_dtype).replace("torch.", "") if amp_dtype else None, "decode_amp": args.decode_amp and bool(amp_dtype),
        "config": {k: getattr(cfg, k) for k in ("vocab_size", "d_model", "n_heads", "d_ff", "encoder_layers",
                                                "decoder_layers", "dropout", "max_tokens", "max_extra_len")},
        "vocab": m.VOCAB, "parameters": n_params, "max_abs_logit_diff_same_weights": same,
        "train_steps": steps, "warmup_steps": warmup, "test_sentences": len(ids), "load_s": round(load_s, 1),
        "train": train, "decode": decode,
    }
    info["total_s"] = round(time.perf_counter() - wall, 1)
    if not args.json_only:
        print_table(info)
    print("BENCHMARK_JSON " + json.dumps(info))


def print_table(info: dict) -> None:
    def fmt(x):
        return "-" if x is None else f"{x:,.1f}" if isinstance(x, float) else str(x)

    def row(what, ours, theirs, note=""):
        ratio = f"{ours / theirs:.2f}" if ours and theirs else "-"
        print(f"| {what} | {fmt(ours)} | {fmt(theirs)} | {ratio} | {note} |")

    c = info["config"]
    print(f"\n{info['device']}, torch {info['torch']} ({info['threads']} threads), preset {info['preset']}: "
          f"d_model {c['d_model']}, {c['n_heads']} heads, d_ff {c['d_ff']}, {c['encoder_layers']}+{c['decoder_layers']} "
          f"layers, vocab {info['vocab']:,}, {info['parameters']:,} parameters, max_tokens {c['max_tokens']}, "
          f"amp {info['amp']}; same weights -> max |logit difference| {info['max_abs_logit_diff_same_weights']:.1e}\n")
    print("| measure | notebook | nn.Transformer | notebook / nn.Transformer | notes |\n| --- | ---: | ---: | ---: | --- |")
    t = info["train"]
    row(f"training tokens/s ({info['train_steps']} steps)", t["notebook"]["tokens_per_s"], t["torch"]["tokens_per_s"],
        f"loss/token {t['notebook']['loss_per_token']} vs {t['torch']['loss_per_token']}")
    row("training peak memory (MiB)", t["notebook"]["peak_mib"], t["torch"]["peak_mib"])
    for name, r in info["decode"].items():
        ours, theirs = r["notebook"], r.get("torch", {})
        note = f"{ours['mean_output_tokens']} tokens/sentence; peak MiB {fmt(ours['peak_mib'])} / {fmt(theirs.get('peak_mib'))}"
        if "_no_cache" in name:
            note += f"; same outputs as cache: {ours['same_outputs_as_cache']:.0%} / {theirs['same_outputs_as_cache']:.0%}"
        row(f"{name.replace('_', ' ')}: sentences/s ({info['test_sentences']})", ours["sentences_per_s"],
            theirs.get("sentences_per_s"), note)
    print(f"\nloading the notebook {info['load_s']}s, everything {info['total_s']}s\n")


if __name__ == "__main__":
    main()
