"""Try settings for a preset on validation data only: how the `cpu` preset was chosen (plan.md, issue 28).

    python tests/tools/try_preset.py train l22 '{"encoder_layers": 2, "decoder_layers": 2, "epochs": 7}' \
        --preset cpu --data-dir ../shared/data/multi30k            # trains, then scores on validation only
    python tests/tools/try_preset.py speed '{"base": {}, "l22": {"encoder_layers": 2, "decoder_layers": 2}}' \
        --preset cpu --data-dir ../shared/data/multi30k --threads 2  # seconds an epoch of each, alone on the machine
    python tests/tools/try_preset.py train tiny '{"epochs": 1}'     # smoke preset, the repository's slice: seconds

`train` runs the notebook's cells with `cfg = make_config(**settings)` (so the tokenizer and batches follow the
settings), trains with the notebook's own train() for the preset's epochs (time budget lifted: every run gets all
its epochs, so runs compare at a fixed length) and keeps --snapshots weight snapshots over the final --span of the
run. It never decodes the test set: it prints the validation greedy BLEU of the last weights and of the average of
the last k snapshots, then beam 4 with each of section 11's alphas on the best average. The result (and the
validation NLL after each epoch) goes to <work>/<name>/result.json and one line `TRY_JSON {...}`.

`speed` times the notebook's train_step on each variant's own batches (one epoch's order) in --rounds alternating
rounds of --tokens target tokens each (the first round untimed) and prints target tokens a second and the seconds
an epoch's steps take, with each variant's median speed relative to the first. Settings that change the data
(vocab_size) are not supported there. A timing taken while another job runs is worthless: run it alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # common.py beside this file
from common import (
    load_notebook_module,
    read_notebook,
    with_settings,
    write_json,
    write_notebook,
)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=["train", "speed"])
    p.add_argument("name", nargs="?", help="train: the run's name (its folder under --work-dir)")
    p.add_argument("settings", help="train: make_config overrides as JSON; speed: {variant: overrides}")
    p.add_argument("--preset", default="smoke")
    p.add_argument("--data-dir", default="tests/data/multi30k", help="folder of {train,validation,test}.{de,en}")
    p.add_argument("--work-dir", default="", help="where runs keep their files (default: a temporary folder)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (default 0: torch's choice)")
    p.add_argument("--snapshots", type=int, default=10, help="train: snapshots kept over the final span")
    p.add_argument("--span", type=float, default=0.3, help="train: the final share of the run they cover")
    p.add_argument("--rounds", type=int, default=4, help="speed: rounds, the first untimed")
    p.add_argument("--tokens", type=int, default=30_000, help="speed: target tokens a variant trains in a round")
    return p.parse_args()


def notebook_with(settings: dict, preset: str, data_dir: str, folder: Path):
    """The notebook's cells (slow ones skipped) run with `cfg = make_config(**settings)`, from a copy in `folder`."""
    copy = folder / "transformer.ipynb"
    write_notebook(with_settings(read_notebook(), settings), copy)
    return load_notebook_module(preset, data_dir, str(folder / "work"), path=copy)


def train(args, root: Path) -> dict:
    settings = {"average_last": args.snapshots, "average_span": args.span, "progress": False,
                **json.loads(args.settings), "time_budget_min": 1e6}  # fixed epochs: no budget cuts a run short
    m = notebook_with(settings, args.preset, args.data_dir, root / args.name)
    cfg = m.cfg
    m.seed_everything(cfg.seed)
    model = m.build_model(cfg, m.VOCAB).to(m.device)
    fingerprint = m.model_fingerprint(cfg, m.corpus_fingerprint(m.corpus), model)
    state = m.train(model, m.train_batches, m.valid_batches, cfg, m.device, fingerprint)
    last = {k: v.detach().clone() for k, v in model.state_dict().items()}
    snapshots = [w for w in map(m.load_weights, m.weight_files(m.run_folder(cfg, fingerprint), "snapshot")) if w is not None]
    src, ref = m.scored_split(m.corpus, "validation", cfg)

    def bleu(weights: dict, beam: int = 1, alpha: float = cfg.length_penalty) -> float:
        model.load_state_dict(weights)
        hyps = m.decode_corpus(model, m.tokenizer, src, dataclasses.replace(cfg, length_penalty=alpha), m.device, beam)
        return round(m.corpus_bleu(hyps, ref, m.headline_tokenize(m.STYLE))[0], 2)

    greedy = {"last": bleu(last)}
    for k in range(2, len(snapshots) + 1):  # each file read once, above; a damaged one left out, as candidate_weights does
        greedy[f"last {k} of {len(snapshots)}"] = bleu(m.average_weights(snapshots[-k:]))
    best = max((k for k in greedy if k != "last"), key=greedy.get, default="last")
    weights = last if best == "last" else m.average_weights(snapshots[-int(best.split()[1]):])
    return {"name": args.name, "preset": args.preset, "settings": settings, "steps": state.step,
            "epochs": state.epoch, "train_min": round(state.seconds / 60, 2), "threads": torch.get_num_threads(),
            "validation_sentences": len(src), "val_nll": state.history["val_nll"], "valid_greedy": greedy,
            "best_average": best, "valid_beam4": {str(a): bleu(weights, 4, a) for a in m.SWEEP_ALPHAS}}


def speed(args, root: Path) -> dict:
    variants = json.loads(args.settings)
    m = notebook_with({"progress": False}, args.preset, args.data_dir, root / "speed")
    runs = {}
    for name, overrides in variants.items():
        cfg = dataclasses.replace(m.cfg, **overrides)
        if cfg.vocab_size != m.cfg.vocab_size:
            raise SystemExit(f"{name}: speed keeps the preset's tokenizer; vocab_size cannot change here")
        batches = m.make_batches(*m.data["train"], cfg.max_tokens)
        m.seed_everything(cfg.seed)
        model = m.build_model(cfg, m.VOCAB)
        amp_dtype, scaler = m.autocast_dtype(torch.device("cpu"), cfg.amp), torch.amp.GradScaler("cpu")
        runs[name] = {"cfg": cfg, "model": model, "optimizer": m.make_optimizer(model, cfg), "amp": amp_dtype,
                      "scaler": scaler, "step": 0, "rates": [], "steps_per_epoch": len(batches),
                      "epoch_tokens": sum(b.n_tokens for b in batches),
                      "batches": [batches[i] for i in m.epoch_order(len(batches), cfg.seed, 0)]}
    for r in range(args.rounds):
        for run in list(runs.values())[:: 1 if r % 2 == 0 else -1]:
            run["model"].train()
            tokens, start = 0, time.perf_counter()
            while tokens < args.tokens:
                batch = run["batches"][run["step"] % len(run["batches"])]
                m.train_step(run["model"], batch, run["optimizer"], run["scaler"], run["amp"], run["cfg"],
                             run["step"] + 1)
                run["step"], tokens = run["step"] + 1, tokens + batch.n_tokens
            if r > 0:
                run["rates"].append(tokens / (time.perf_counter() - start))
    first = next(iter(runs.values()))["rates"]
    out = {}
    for name, run in runs.items():
        rate = statistics.median(run["rates"])
        ratios = [a / b for a, b in zip(run["rates"], first)]
        out[name] = {"steps_per_epoch": run["steps_per_epoch"], "tokens_per_s": round(rate),
                     "epoch_s": round(run["epoch_tokens"] / rate, 1), "speed_ratio": round(statistics.median(ratios), 3),
                     "ratio_min": round(min(ratios), 3), "ratio_max": round(max(ratios), 3)}
        print(f"{name:>12}: {run['steps_per_epoch']} steps an epoch, {rate:7.0f} target tokens/s, an epoch's steps "
              f"{out[name]['epoch_s']:5.0f} s, {out[name]['speed_ratio']:.3f}x the first "
              f"({out[name]['ratio_min']:.2f}-{out[name]['ratio_max']:.2f})")
    return out


def main():
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.mode == "train" and not args.name:
        raise SystemExit("train needs a name for the run")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.work_dir or tmp).resolve()
        args.data_dir = str(Path(args.data_dir).resolve())
        result = train(args, root) if args.mode == "train" else speed(args, root)
        if args.mode == "train":
            write_json(root / args.name / "result.json", result)
        print("TRY_JSON " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
