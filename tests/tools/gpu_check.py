"""What only a GPU can measure, in one JSON file: part of the one command of the first GPU run (gpu_run.py).

    python tests/tools/gpu_check.py             # on a CUDA machine: writes results/gpu/<device name>.json
    python tests/tools/gpu_check.py --dry-run   # on a CPU: every phase at smoke sizes, (tests/test_tools.py runs it)

Without a CUDA GPU (and without --dry-run) it says so and exits 0, having run and written nothing. On a GPU it runs
six phases, in this order, each on its own and each within its own time limit (PHASE_LIMITS_S, and never past
--deadline-s; a dry run has only the deadline): a phase that fails or runs out of time records its error and the
next one runs, and the file is rewritten after each phase.

1. benchmark: `tests/tools/benchmark.py --preset multi30k`: the notebook's model against nn.Transformer at the multi30k
   preset's sizes, training and decoding (Multi30k from --multi30k-dir, else ../shared/data/multi30k, else the slice
   in tests/data).
2. memory: `tests/tools/benchmark.py --memory iwslt14`: the iwslt14 preset's training memory at its max_tokens.
3. iwslt14_train: the iwslt14 preset trained by the notebook's own train() for --epochs epochs on the Hub-style
   IWSLT14 *validation* text (7,283 pairs: the 160,239-pair training split cannot be had offline), validated on the
   same text: steps, seconds and peak memory of each epoch, and a projection to the real training split.
4. evaluation: how long section 11 takes on the real 6,750-sentence test set, timed with the weights phase 3 trained
   (a weak model; untrained weights of the same shape if phase 3 failed: they decode to the length limit, so the
   times over-estimate). Timed: greedy and beam on the test set, greedy on (up to) 1,000 validation sentences, the
   beam / alpha sweep on the same validation sentences, and greedy under training's autocast (its time, and the share
   of outputs equal to fp32: the notebook decodes in fp32). Section 11 does the first three for each of 2 weight sets,
   a greedy validation decoding for every epoch's and snapshot's weights, and (when the sweep's choice is not the
   preset's) a second scoring with the chosen beam: `estimate_evaluation_s` adds them up for the projected number of
   epochs. Both weight sets are timed with one set of weights.
5. fp16: one epoch of phase 3's training from fresh weights under fp16 autocast with the gradient scaler, the path a
   GPU without bf16 (Colab's T4) takes: the steps the scaler skipped, whether the weights stay finite, and the
   losses beside phase 3's first bf16 epoch.
6. notebook: the whole notebook on the smoke preset, in a kernel (nbclient, as tests/test_end_to_end.py): that it runs
   on this GPU, its wall time, its BLEU lines and section 7's estimate of a step's time. Last, since gpu_run.py runs
   the whole notebook on the multi30k preset first.

The Hub-style text is looked for in --iwslt14-dir, then shared/data/iwslt14/hub under the repository, ../shared
beside it, /work/shared, and tests/data/iwslt14. With --dry-run the phases run on this machine's device at smoke
sizes (the smoke preset, the repository's slices, a few steps and sentences) and the file is named after the CPU:
only that the phases run, never what they measure.
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
import subprocess
import sys
import tempfile
import time
import traceback
from contextlib import contextmanager
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]  # tests/tools/gpu_check.py: the repository root
TESTS = ROOT / "tests"
TOOLS = TESTS / "tools"
NOTEBOOK = ROOT / "transformer.ipynb"
PHASES = ("benchmark", "memory", "iwslt14_train", "evaluation", "fp16", "notebook")
PHASE_LIMITS_S = {"benchmark": 150, "memory": 60, "iwslt14_train": 120, "evaluation": 150, "fp16": 60,
                  "notebook": 150}  # each phase's own limit, on a GPU (what it was expected to take, and room)
DRY_SENTENCES = 8  # sentences decoded by a dry run's phases
IWSLT14_TRAIN_PAIRS = 160_239  # the Hub's training split (fairseq's prepare-iwslt14.sh)
NO_GPU = "No CUDA GPU here: gpu_check.py measures only on a GPU. Nothing was run and nothing was written."


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "results" / "gpu"), help="folder for <device name>.json")
    p.add_argument("--skip", default="", help=f"phases to leave out, comma-separated: {', '.join(PHASES)}")
    p.add_argument("--iwslt14-dir", help="a folder of Hub-style validation.{de,en} and test.{de,en}")
    p.add_argument("--multi30k-dir", help="Multi30k for the benchmark (default: ../shared/data/multi30k, else the "
                   "slice in tests/data/multi30k)")
    p.add_argument("--epochs", type=int, default=2, help="epochs of phase 3 (the first one meets every batch shape "
                   "for the first time, the last one is the steady speed)")
    p.add_argument("--deadline-s", type=float, default=math.inf, help="seconds from now by which every phase has "
                   "ended: a phase gets the smaller of its own limit and what is left (gpu_run.py's budget)")
    p.add_argument("--dry-run", action="store_true", help="on any device, every phase at smoke sizes in seconds: "
                   "that the command runs, not what it measures")
    args = p.parse_args(argv)
    unknown = set(filter(None, args.skip.split(","))) - set(PHASES)
    if unknown:
        p.error(f"--skip: unknown phase(s) {', '.join(sorted(unknown))}; the phases are {', '.join(PHASES)}")
    return args


# ---------------------------------------------------------------------------------------------------------------------
# pure helpers (tested on a CPU)


def current_commit() -> str | None:
    """$GPU_RUN_COMMIT (a device gets the files without .git), else git's HEAD."""
    return os.environ.get("GPU_RUN_COMMIT") or subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False).stdout.strip() or None


def write_json(path: Path, data: dict) -> None:
    """`data` into `path` whole: a temporary file, then a rename (a run killed meanwhile leaves the last version)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


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


# ---------------------------------------------------------------------------------------------------------------------
# measurements (any device; tested on a CPU with tiny sizes)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def memory_mib(device: torch.device) -> dict:
    if device.type != "cuda":
        return {"peak_allocated_mib": None, "peak_reserved_mib": None}
    return {"peak_allocated_mib": round(torch.cuda.max_memory_allocated(device) / 2**20, 1),
            "peak_reserved_mib": round(torch.cuda.max_memory_reserved(device) / 2**20, 1)}


class PhaseTimeout(Exception):
    """A phase ran past its time limit."""


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


# ---------------------------------------------------------------------------------------------------------------------
# the phases (a GPU only)


def stream_text(nb) -> str:
    """What the code cells of an executed notebook printed (stdout and stderr)."""
    return "\n".join("".join(o.get("text", "") for o in c.get("outputs", []) if o.output_type == "stream")
                     for c in nb.cells if c.cell_type == "code")


def execute_notebook(preset: str, work: Path, data_dir: str | Path | None, save_to: Path | None = None,
                     notebook: Path = NOTEBOOK):
    """The whole notebook (or another copy of it) in a kernel (nbclient) on `preset`, from the repository root, work
    folder `work`; with save_to, the executed notebook is written there after every cell, so that a run cut short
    keeps what it did. Returns the notebook; a failing cell raises nbclient's CellExecutionError (the notebook up to
    it is saved)."""
    import nbformat
    from nbclient import NotebookClient
    from nbloader import notebook_environment

    nb = nbformat.read(notebook, as_version=4)

    def save(**_) -> None:
        if save_to is not None:
            tmp = save_to.with_name(save_to.name + ".tmp")
            nbformat.write(nb, tmp)
            os.replace(tmp, save_to)

    with notebook_environment(preset, work, data_dir):
        client = NotebookClient(nb, timeout=3600, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}},
                                on_cell_executed=save)
        try:
            client.execute()
        finally:
            save()
    return nb


def run_smoke_notebook(work: Path) -> dict:
    nb = execute_notebook("smoke", work, None)
    results = work / "results.json"
    return {**notebook_summary(stream_text(nb)),
            "results": json.loads(results.read_text()) if results.exists() else None}


def run_benchmark(*args: str) -> dict:
    command = [sys.executable, str(TOOLS / "benchmark.py"), *args, "--json-only"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)  # time_limit stops it
    if done.returncode:
        raise RuntimeError(f"{' '.join(command[1:])} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return {"command": " ".join(["python", *command[1:]]), **benchmark_json(done.stdout)}


def load_iwslt14(hub: Path, work: Path, preset: str = "iwslt14"):
    """The notebook's module on the iwslt14 preset (a dry run: smoke), its data the training folder made from `hub`."""
    from benchmark import load_notebook_module

    data = iwslt14_training_folder(hub, work / "data")
    return load_notebook_module(preset, str(data), str(work / "run"))


def fp16_epoch(m, cfg, device, fingerprint: dict, work: Path, max_steps: int | None = None) -> dict:
    """One epoch of the notebook's train() from fresh weights (seeded as phase 3's) in a fresh folder, with section
    7's autocast_dtype made to answer fp16: the path of a GPU without bf16, where the gradient scaler matters."""
    chosen = m.autocast_dtype
    m.autocast_dtype = lambda device, enabled: torch.float16 if enabled else None
    try:
        m.seed_everything(cfg.seed)
        model = m.build_model(cfg, m.VOCAB).to(device)
        cfg = dataclasses.replace(cfg, epochs=1, work_dir=str(work))
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        sync(device)
        start = time.perf_counter()
        state = m.train(model, m.train_batches, m.valid_batches, cfg, device, fingerprint, max_steps)
        sync(device)
        seconds = time.perf_counter() - start
    finally:
        m.autocast_dtype = chosen
    return {"steps": state.step, "seconds": seconds, "skipped_steps": state.skipped_steps,
            "train_loss": state.history["train_loss"], "val_loss": state.history["val_loss"],
            "finite_weights": all(torch.isfinite(p).all().item() for p in model.parameters()), **memory_mib(device)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    dry = args.dry_run
    if not torch.cuda.is_available() and not dry:
        print(NO_GPU)
        return 0
    ends_at = time.monotonic() + args.deadline_s
    sys.path[:0] = [str(TOOLS), str(TESTS)]  # benchmark.py beside this file, nbloader.py in tests/
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
        except Exception as error:  # noqa: BLE001 - one phase's failure must not lose the others
            results[key] = {"error": f"{type(error).__name__}: {error}"[:3000],
                            "traceback": traceback.format_exc()[-3000:]}
        results[key]["wall_s"] = round(time.perf_counter() - start, 1)
        write_json(path, results)
        print(f"[gpu_check] {key} done in {results[key]['wall_s']} s" + (" (failed)" if "error" in results[key] else ""),
              flush=True)

    multi30k = find_folder(data_candidates("multi30k", args.multi30k_dir), ("train.de", "validation.de", "test.de"))
    hub = find_folder(data_candidates("iwslt14/hub", args.iwslt14_dir),
                      tuple(f"{s}.{lang}" for s in ("validation", "test") for lang in ("de", "en")))
    preset = "smoke" if dry else "iwslt14"
    small = ["--steps", "2", "--rounds", "1", "--warmup", "0", "--sentences", "2"] if dry else ["--sentences", "300"]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        phase("benchmark", lambda: run_benchmark("--preset", "smoke" if dry else "multi30k", "--data-dir",
                                                 str(multi30k or TESTS / "data" / "multi30k"), *small))
        phase("memory", lambda: run_benchmark("--memory", preset))

        def module() -> object:
            """The notebook's module on the IWSLT14 text, loaded once for the phases that need it."""
            if "m" not in shared:
                if hub is None:
                    raise FileNotFoundError("no Hub-style IWSLT14 text found in " + ", ".join(
                        map(str, data_candidates("iwslt14/hub", args.iwslt14_dir))) + ": pass --iwslt14-dir")
                shared["m"] = load_iwslt14(hub, work / "iwslt14", preset)
            return shared["m"]

        def iwslt14_train() -> dict:
            m = module()
            cfg, m.model = m.cfg, None  # the cells' own model:
            if device.type == "cuda":
                torch.cuda.empty_cache()  # out of the peak memory
            m.seed_everything(cfg.seed)
            model = shared["model"] = m.build_model(cfg, m.VOCAB).to(device)
            amp_dtype = m.autocast_dtype(device, cfg.amp)
            fingerprint = shared["fingerprint"] = m.model_fingerprint(cfg, m.corpus_fingerprint(m.corpus))
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

        def fp16() -> dict:
            m = module()
            fingerprint = shared.get("fingerprint") or m.model_fingerprint(m.cfg, m.corpus_fingerprint(m.corpus))
            bf16 = results.get("iwslt14_train", {}).get("epochs", [{}])[0]
            return {**fp16_epoch(m, m.cfg, device, fingerprint, work / "fp16", 3 if dry else None),
                    "autocast_epoch_1": {k: bf16.get(k) for k in ("steps", "seconds", "train_loss", "val_loss")}}

        phase("fp16", fp16)
        phase("notebook", lambda: run_smoke_notebook(work / "smoke"))
    print(f"[gpu_check] wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
