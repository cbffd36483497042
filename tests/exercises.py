"""Section 13's exercises, each run as the notebook describes it, and measured (issue 29).

    python tests/exercises.py list                                  # the exercises and what each changes
    python tests/exercises.py run baseline --seed 1235 --threads 1  # -> results/exercises/baseline-seed1235/
    python tests/exercises.py run 1-pre-norm --threads 1            # -> results/exercises/1-pre-norm/
    python tests/exercises.py table                                 # every run's figures: results/exercises/README.md's table
    python tests/exercises.py notebook                              # section 13's table and figure, written into the notebook

A run copies transformer.ipynb, makes the exercise's change in the copy and executes it headless with the `cpu`
preset on Multi30k (--data-dir, default ../shared/data/multi30k), as the published run in results/cpu does. The change is
either settings, written into section 1's line `cfg = make_config()`, or the exercise's own edit of the model's
code: PATCHES below, exact text replacements, each of which must match exactly once (so that an edit of the
notebook that breaks one fails loudly; tests/test_13_exercises.py checks them all). The readable code gains no
switches for this.

Every run but exercise 5 trains all the preset's epochs, whatever its time budget (time_budget_min lifted), so
that runs compare at equal steps and several may share the machine (--threads 1 each). Exercise 5 is about what the
budget allows: it keeps the budget, and must run alone on the machine with its threads.

A run writes results/exercises/<name>[-seed<N>]/: results.json and history.json (the files the notebook writes),
transformer.ipynb (the executed copy) and run.json (the command, the commit, the CPU model, threads, dates and
minutes, and the error that stopped the notebook, if one did: a diverged run stops at its training cell). After each
run, and with `summarize`, results/exercises/summary.json gathers every run's figures. `notebook` writes them into
section 13 from the committed summary.json: a markdown table and an attached figure (exercises.png), so that the
notebook shows them without a network (tests/test_13_exercises.py checks that the table is summary.json's).
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import io
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/: its tools package, when run as a script
from tools.common import ROOT, current_commit, keep_run_files, with_settings, write_json

NOTEBOOK = ROOT / "transformer.ipynb"
RESULTS = ROOT / "results" / "exercises"
PUBLISHED = ROOT / "results" / "cpu"  # the notebook's published run of the `cpu` preset (section 13's table names it)
NOTEBOOK_CELL = "**The exercises' runs**"  # how section 13's markdown cell that `notebook` writes begins
FIGURE = "exercises.png"  # its attachment
PRESET_WARMUP = 1000  # the `cpu` preset's warmup_steps (a test checks it against PRESETS)

PRE_NORM = (
    ("        return self.norm(x + self.dropout(sublayer(x)))",
     "        return x + self.dropout(sublayer(self.norm(x)))  # exercise 1: pre-norm"),
    ("        self.decoder = nn.ModuleList(DecoderLayer(*layer_args) for _ in range(decoder_layers))\n",
     ("        self.decoder = nn.ModuleList(DecoderLayer(*layer_args) for _ in range(decoder_layers))\n"
      "        self.encoder_norm, self.decoder_norm = nn.LayerNorm(d_model), nn.LayerNorm(d_model)  # exercise 1\n")),
    ("        return x, src_mask", "        return self.encoder_norm(x), src_mask  # exercise 1"),
    ("        return F.linear(y, self.embedding.weight)",
     "        return F.linear(self.decoder_norm(y), self.embedding.weight)  # exercise 1"),
)
UNTIED = (
    ("        self.embedding = nn.Embedding(vocab_size, d_model, padding_idx=PAD)  # E: source, target and output\n",
     ("        self.embedding = nn.Embedding(vocab_size, d_model, padding_idx=PAD)  # exercise 6: the target's only\n"
      "        self.source_embedding = nn.Embedding(vocab_size, d_model, padding_idx=PAD)  # exercise 6\n"
      "        self.output = nn.Linear(d_model, vocab_size, bias=False)  # exercise 6: Xavier, as every matrix\n")),
    ('            if p.dim() > 1 and name != "embedding.weight":',
     '            if p.dim() > 1 and not name.endswith("embedding.weight"):  # exercise 6'),
    (("        nn.init.normal_(self.embedding.weight, std=d_model ** -0.5)\n"
      "        nn.init.zeros_(self.embedding.weight[PAD])\n"),
     ("        for table in (self.embedding, self.source_embedding):  # exercise 6\n"
      "            nn.init.normal_(table.weight, std=d_model ** -0.5)\n"
      "            nn.init.zeros_(table.weight[PAD])\n")),
    ("    def embed(self, tokens: torch.Tensor, offset: int = 0) -> torch.Tensor:",
     "    def embed(self, tokens: torch.Tensor, offset: int = 0, table: nn.Embedding | None = None) -> torch.Tensor:"),
    ("        x = self.embedding(tokens) * math.sqrt(self.d_model)",
     "        x = (self.embedding if table is None else table)(tokens) * math.sqrt(self.d_model)  # exercise 6"),
    ("        x = self.embed(src)\n", "        x = self.embed(src, table=self.source_embedding)  # exercise 6\n"),
    ("        return F.linear(y, self.embedding.weight)", "        return self.output(y)  # exercise 6"),
)
LEARNED_POSITIONS = (
    ('        self.register_buffer("positions", sinusoidal_positions(max_positions, d_model), persistent=False)',
     "        self.positions = nn.Parameter(torch.empty(max_positions, d_model))  # exercise 7: Xavier below"),
)
NO_CAUSAL_MASK = (  # the bug training does not show: the decoder's self-attention sees the whole target
    ("self.self_attn(y, causal=cache is None, cache=self_cache))\n",
     "self.self_attn(y, causal=False, cache=self_cache))  # exercise 8: the causal mask left out\n"),
)


@dataclasses.dataclass(frozen=True)
class Exercise:
    number: int  # section 13's exercise (0: the baseline)
    what: str  # what changes, in one line
    settings: dict = dataclasses.field(default_factory=dict)  # make_config overrides
    patches: tuple = ()  # (old, new) texts of the notebook's code cells
    fixed_epochs: bool = True  # False: the time budget may stop it (exercise 5: run it alone)


EXERCISES = {
    "baseline": Exercise(0, "the `cpu` preset, unchanged"),
    "1-pre-norm": Exercise(1, "pre-norm residuals, and a LayerNorm after each stack", patches=PRE_NORM),
    "2-no-warmup": Exercise(2, "warmup_steps=1: the same decay, no warmup (peak √1000 times higher)",
                            {"warmup_steps": 1}),
    "2-no-warmup-same-peak": Exercise(2, "warmup_steps=1, lr_factor=1000**-0.5: the same peak, then decay",
                                      {"warmup_steps": 1, "lr_factor": PRESET_WARMUP ** -0.5}),
    "3-no-label-smoothing": Exercise(3, "label_smoothing=0.0", {"label_smoothing": 0.0}),
    "5-paper-sizes": Exercise(5, "d_model=512, d_ff=2048, n_heads=8 within the 20-minute budget",
                              {"d_model": 512, "d_ff": 2048, "n_heads": 8}, fixed_epochs=False),
    "6-untied": Exercise(6, "separate source, target and output matrices", patches=UNTIED),
    "7-learned-positions": Exercise(7, "learned positions instead of the sinusoids", patches=LEARNED_POSITIONS),
    "8-no-causal-mask": Exercise(8, "the decoder's causal mask left out (a bug)", patches=NO_CAUSAL_MASK),
}


def settings_of(exercise: Exercise, seed: int | None) -> dict:
    """The make_config overrides of a run: the exercise's, the seed, and the lifted budget for fixed epochs."""
    settings = {**exercise.settings, "progress": False}
    if seed is not None:
        settings["seed"] = seed
    if exercise.fixed_epochs:
        settings["time_budget_min"] = 1e6
    return settings


def apply_patches(nb: nbformat.NotebookNode, patches) -> list[int]:
    """Make each (old, new) replacement in the code cells, where `old` occurs exactly once; returns the cells changed."""
    changed = []
    for old, new in patches:
        where = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and old in c.source]
        count = sum(nb.cells[i].source.count(old) for i in where)
        if count != 1:
            raise ValueError(f"the patch text occurs {count} times in the notebook's code, not once: {old.strip()!r:.90}"
                             " (the notebook changed: update tests/exercises.py)")
        nb.cells[where[0]].source = nb.cells[where[0]].source.replace(old, new)
        changed.append(where[0])
    return sorted(set(changed))


def exercise_notebook(exercise: Exercise, seed: int | None = None, path: Path = NOTEBOOK) -> nbformat.NotebookNode:
    """The notebook with the exercise's code patches and settings, outputs cleared."""
    nb = nbformat.read(path, as_version=4)
    apply_patches(nb, exercise.patches)
    return with_settings(nb, settings_of(exercise, seed))


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        return platform.processor() or "unknown"


def run(name: str, seed: int | None, threads: int | None, data_dir: Path, out_root: Path, force: bool) -> dict:
    """Execute the exercise's notebook headless and keep its files under out_root/<name>[-seed<N>]."""
    import torch  # for its default thread count, which the kernel's torch uses too
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, DeadKernelError

    exercise = EXERCISES[name]
    out = out_root / (name if seed is None else f"{name}-seed{seed}")
    if (out / "run.json").exists() and not force:
        raise SystemExit(f"{out} holds a finished run already: pass --force to replace it")
    nb = exercise_notebook(exercise, seed)
    record = {"exercise": name, "number": exercise.number, "what": exercise.what, "seed": seed,
              "settings": settings_of(exercise, seed), "patches": len(exercise.patches),
              "command": "python tests/exercises.py " + " ".join(sys.argv[1:]), "commit": current_commit(("transformer.ipynb", "tests/exercises.py")),
              "cpu": cpu_model(), "threads": threads or torch.get_num_threads(),
              "started": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "error": None}
    with tempfile.TemporaryDirectory() as tmp:
        env = {"TRANSFORMER_PRESET": "cpu", "TRANSFORMER_PROGRESS": "0", "TRANSFORMER_DATA_DIR": str(data_dir),
               "TRANSFORMER_WORK_DIR": str(Path(tmp) / "work")}
        if threads:
            env["OMP_NUM_THREADS"] = str(threads)  # torch's CPU threads in the kernel
        os.environ.update(env)
        start = time.time()
        try:
            NotebookClient(nb, timeout=None, kernel_name="python3", resources={"metadata": {"path": tmp}}).execute()
        except CellExecutionError as error:  # a diverged run stops at its training cell: kept, with the reason
            record["error"] = f"{error.ename}: {error.evalue}"[:300]
        except DeadKernelError as error:  # out of memory, say: what ran is kept
            record["error"] = f"the kernel died: {error}"[:300]
        record["wall_min"] = round((time.time() - start) / 60, 1)
        keep_run_files(Path(tmp) / "work", out)
        nbformat.write(nb, out / "transformer.ipynb")
    write_json(out / "run.json", record)
    print(json.dumps(record, ensure_ascii=False))
    return record


def summary_row(folder: Path) -> dict:
    """One run's line of results/exercises/summary.json, from the files of its folder."""
    record = json.loads((folder / "run.json").read_text(encoding="utf-8"))
    history = json.loads((folder / "history.json").read_text()) if (folder / "history.json").exists() else {}
    results = json.loads((folder / "results.json").read_text()) if (folder / "results.json").exists() else {}
    row = {key: record[key] for key in ("exercise", "number", "what", "seed", "error", "cpu", "threads", "commit")}
    row["run"] = folder.name
    row["epoch_step"], row["val_nll"] = history.get("epoch_step", []), history.get("val_nll", [])
    row["steps"] = history["step"][-1] if history.get("step") else 0
    if results:
        kept, bleu = results["kept"], results["bleu"]
        row.update(kept=kept, beam4=bleu.get(f"{kept}, beam 4"), greedy=bleu.get(f"{kept}, greedy"),
                   chosen=results.get("chosen_on_validation"))
        row["chosen_bleu"] = bleu.get(f"{kept}, {row['chosen']}") if row["chosen"] else row["beam4"]
    return row


def summary_rows(root: Path = RESULTS) -> list[dict]:
    """Every run folder's row, in the order of the exercises, then of the seeds."""
    rows = [summary_row(run_json.parent) for run_json in root.glob("*/run.json")]
    return sorted(rows, key=lambda row: (row["number"], row["exercise"], row["seed"] or 0))


def summarize(root: Path = RESULTS) -> list[dict]:
    """Write root/summary.json, every finished run's figures in one file: what section 13's table and figure read."""
    rows = summary_rows(root)
    write_json(root / "summary.json", rows)
    return rows


def perplexity(nll: float) -> float:
    return math.exp(nll) if nll < 700 else math.inf  # a diverged run's NLL would overflow


def markdown_table(rows: list[dict]) -> str:
    """summary.json as results/exercises/README.md's table (`python tests/exercises.py table`; a test checks that it is there)."""
    lines = ["| run | what changed | steps | validation perplexity | test greedy | test beam 4 | chosen on validation: test |",
             "| --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        ppl = f"{perplexity(r['val_nll'][-1]):.2f}" if r["val_nll"] else "–"
        scores = (f"{r['greedy']:.2f} | {r['beam4']:.2f} | {r['chosen']}: {r['chosen_bleu']:.2f}" if r.get("beam4") is not None
                  else f"– | – | stopped: {r['error'] or 'no results.json'}")
        lines.append(f"| `{r['run']}` | {r['what']} | {r['steps']:,} | {ppl} | {scores} |")
    return "\n".join(lines)


def exercise_table(rows: list[dict]) -> str:
    """Section 13's table: each run's steps, validation perplexity, test BLEU of the kept weights, beam 4 against the
    baseline seeds' mean (above, in or below their range: what noise alone does), the epochs whose validation NLL
    lies below / above every seed's, and the beam and alpha chosen on validation with their test BLEU; then the
    seeds' range and the count of section 11's sweep, in words."""
    base = [r for r in rows if r["exercise"] == "baseline" and r.get("beam4") is not None]
    seeds, beam4 = [r["val_nll"] for r in base], [r["beam4"] for r in base]
    lines = [("| run | what changed | steps | valid perplexity | test greedy | test beam 4 | beam 4 − the seeds' mean (in "
              "their range?) | epochs below / above the seeds | chosen on validation: test |"),
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        ppl = f"{perplexity(r['val_nll'][-1]):.2f}" if r["val_nll"] else "–"
        epochs = "–"
        if seeds and r["val_nll"] and r["exercise"] != "baseline":
            low = sum(x < min(s) for x, s in zip(r["val_nll"], zip(*seeds)))
            high = sum(x > max(s) for x, s in zip(r["val_nll"], zip(*seeds)))
            epochs = f"{low} / {high} of {len(r['val_nll'])}"
        if r.get("beam4") is None:
            scores = f"– | – | {r['error'] or 'no results.json'} | {epochs} | –"
        else:
            gain = "–"
            if beam4:
                where = "above" if r["beam4"] > max(beam4) else "below" if r["beam4"] < min(beam4) else "in"
                gain = f"{r['beam4'] - sum(beam4) / len(beam4):+.2f} ({where})"
            chosen = f"{r['chosen']}: {r['chosen_bleu']:.2f}" if r["chosen"] else "–"
            scores = f"{r['greedy']:.2f} | {r['beam4']:.2f} | {gain} | {epochs} | {chosen}"
        lines.append(f"| `{r['run']}` | {r['what']} | {r['steps']:,} | {ppl} | {scores} |")
    words = []
    if beam4:
        words.append(f"The baseline's {len(beam4)} seeds: {min(beam4):.2f} to {max(beam4):.2f} at beam 4 (mean "
                     f"{sum(beam4) / len(beam4):.2f}).")  # the CPU model and threads: results/exercises/README.md
    if scored := [r for r in rows if r.get("beam4") is not None and r["chosen"]]:
        better = sum(r["chosen_bleu"] > r["beam4"] for r in scored)
        words.append(f"Section 11's sweep: the choice on validation beats beam 4 (α 0.6) on test in {better} of {len(scored)} "
                     "runs.")
    return "\n".join(lines) + ("\n\n" + " ".join(words) if words else "")


def exercise_figure(rows: list[dict], top: float = 7.0):
    """(figure, notes): validation NLL after each epoch (left, runs with a value below `top`) and its difference from
    the baseline seeds' mean (right); per exercise its seeds' mean, bars from the lowest seed to the highest; black, dashed
    and on top, the baseline's seeds, whose band shows what noise alone does. The notes name the runs off a panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9.8, 4.4), sharex=True, layout="constrained")
    drawn, groups = [r for r in rows if r["val_nll"] and min(r["val_nll"]) < top], {}
    for r in sorted(drawn, key=lambda r: r["exercise"] != "baseline"):  # exercise: its seeds' curves, baseline first
        groups.setdefault(r["exercise"], []).append(r["val_nll"])
    mean = [sum(v) / len(v) for v in zip(*groups.get("baseline", []))]  # per epoch (empty without a baseline)
    for k, (name, curves) in enumerate(groups.items()):
        low, mid, high = ([f(v) for v in zip(*curves)] for f in (min, lambda v: sum(v) / len(v), max))
        base, x = name == "baseline", [e + 1 + 0.03 * k for e in range(len(mid))]  # offsets: no bar hides another
        colour = "k" if base else ["C0", "C1", "C2", "C3", "C4", "C5", "C6", "C8", "C9"][k % 9]
        bars = [[m - a for m, a in zip(mid, low)], [b - m for m, b in zip(mid, high)]] if len(curves) > 1 else None
        for ax, ref in ((ax1, [0] * len(mid)), (ax2, mean)):
            ax.errorbar(x, [m - s for m, s in zip(mid, ref)], None if base else bars, color=colour, marker=".",
                        capsize=2, zorder=3 if base else 2, ls="--" if base else "-", lw=2 if base else 1.2,  # the baseline on top: the others must not hide it
                        label=None if ax is ax2 else name + (f" ({len(curves)} seeds)" if bars else ""))
            if base and bars:
                ax.fill_between(x, [a - s for a, s in zip(low, ref)], [b - s for b, s in zip(high, ref)], color="0.5",
                                alpha=0.3, lw=0, zorder=1)
    ax1.set(xlabel="epoch", ylabel="validation NLL per token (nats)", yscale="log",
            title="Each exercise against the baseline (black, dashed)")
    ax1.set_yticks([0.05, 0.1, 0.2, 0.5, 1, 2, 4, 6], ["0.05", "0.1", "0.2", "0.5", "1", "2", "4", "6"])  # not 1e-01
    ax1.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax2.axhline(0, color="k", lw=0.6)
    ax2.set(xlabel="epoch", ylabel="NLL − the seeds' mean (nats)", ylim=(-0.3, 0.3),
            title="The same, as a difference: below 0 is better")
    if drawn:
        fig.legend(loc="outside lower center", ncols=3, fontsize=9, title="a line: the mean of an exercise's seeds, "
                   "shifted a little sideways so that no bar hides another; bars and grey band: their lowest to highest", title_fontsize=9)
    notes = []
    if off := [r["run"] for r in rows if r not in drawn]:
        notes.append(f"Not on the left panel (no validation NLL below {top:g}): {', '.join(off)}.")
    if off_right := [r["run"] for r in drawn if any(abs(a - b) > 0.3 for a, b in zip(r["val_nll"], mean))]:
        notes.append(f"Leaving the right panel (more than 0.3 from the seeds' mean): {', '.join(off_right)}.")
    return fig, notes


def exercise_markdown(rows: list[dict]) -> tuple[str, bytes]:
    """Section 13's markdown cell of the runs (its text, and the PNG of exercise_figure that it shows)."""
    import matplotlib.pyplot as plt

    fig, notes = exercise_figure(rows)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, metadata={"Software": None})  # as Colab draws inline figures
    plt.close(fig)
    text = (f"{NOTEBOOK_CELL}, with the unchanged preset's three seeds. "
            f"{' '.join(notes)}\n\n![The exercises' validation curves](attachment:{FIGURE})\n\n" + exercise_table(rows))
    return text + (f"\n\n{note}" if (note := published_note(rows)) else ""), buffer.getvalue()


def published_note(rows: list[dict], published: Path = PUBLISHED) -> str:
    """One sentence under the table: the `baseline` row beside the published run of the same preset (results/cpu),
    whose other thread count rounds sums differently; "" without either."""
    base = next((r for r in rows if r["run"] == "baseline" and r.get("beam4") is not None), None)
    if base is None or not (published / "results.json").exists():
        return ""
    results = json.loads((published / "results.json").read_text(encoding="utf-8"))
    nll = json.loads((published / "history.json").read_text(encoding="utf-8"))["val_nll"][-1]
    bleu, kept = results["bleu"], results["kept"]
    chosen = bleu[f"{kept}, {results['chosen_on_validation']}"]
    same = f"{chosen:.2f}" == f"{base['chosen_bleu']:.2f}"
    return (f"This notebook's published run (results/cpu), same preset and seed as `baseline` ({base['threads']} "
            f"thread{'s' * (base['threads'] != 1)}), ran with default threads on another day's machine, whose sums round "
            f"differently and drift apart as two seeds do: perplexity {perplexity(nll):.2f}, beam 4 "
            f"{bleu[f'{kept}, beam 4']:.2f}, {'but the same' if same else 'and'} test score chosen on validation, "
            f"{chosen:.2f}.")


def write_into_notebook(path: Path = NOTEBOOK, summary: Path = RESULTS / "summary.json") -> None:
    """Write section 13's table and figure of the runs from summary.json into the notebook's cell that shows them."""
    nb = nbformat.read(path, as_version=4)
    cell = next(c for c in nb.cells if c.cell_type == "markdown" and c.source.startswith(NOTEBOOK_CELL))
    cell.source, image = exercise_markdown(json.loads(summary.read_text(encoding="utf-8")))
    cell["attachments"] = {FIGURE: {"image/png": base64.b64encode(image).decode()}}
    nbformat.write(nb, path)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=["list", "run", "summarize", "table", "notebook"])
    p.add_argument("name", nargs="?", choices=list(EXERCISES))
    p.add_argument("--seed", type=int, help="another seed than the preset's (the folder's name says it)")
    p.add_argument("--threads", type=int, help="torch's CPU threads (default: torch's choice, every core)")
    p.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data" / "multi30k"),
                   help="a folder of Multi30k's {train,validation,test}.{de,en}")
    p.add_argument("--out", default=str(RESULTS), help="where the runs' folders go")
    p.add_argument("--force", action="store_true", help="replace a finished run's folder")
    args = p.parse_args()
    if args.mode == "list":
        for name, exercise in EXERCISES.items():
            kind = "code" if exercise.patches else "settings"
            print(f"{name:>24}  ({kind}{'' if exercise.fixed_epochs else ', time budget: run alone'}) {exercise.what}")
        return
    if args.mode == "notebook":
        write_into_notebook()
        print(f"{NOTEBOOK.name}: section 13's table and {FIGURE} written from {RESULTS / 'summary.json'}")
        return
    if args.mode in ("summarize", "table"):
        rows = summarize(Path(args.out).resolve())
        if args.mode == "table":
            print(markdown_table(rows))
        return
    if not args.name:
        raise SystemExit("run needs an exercise's name: see `python tests/exercises.py list`")
    data_dir = Path(args.data_dir).resolve()
    if not all((data_dir / f"{split}.{lang}").is_file() for split in ("train", "validation", "test") for lang in ("de", "en")):
        raise SystemExit(f"{data_dir} has no Multi30k files {{train,validation,test}}.{{de,en}}: pass --data-dir")
    run(args.name, args.seed, args.threads, data_dir, Path(args.out).resolve(), args.force)
    summarize(Path(args.out).resolve())


if __name__ == "__main__":
    main()
