"""Section 13, exercises: every exercise of tests/exercises.py still applies to the notebook, and its changed cells run.

A code exercise's patches must each match the notebook exactly once; then section 5's cells, patched, run in a copy
of the notebook's namespace, and the model they build takes two training steps and decodes (greedy and beam) at
smoke sizes with the notebook's own train_step and decode_corpus. A settings exercise must be a valid Config.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import math
import sys

import nbformat
import pytest
import torch
from helpers import ROOT
from nbloader import NOTEBOOK

sys.path.insert(0, str(ROOT / "tests"))
import exercises
from tools import common


def section_cells(nb: nbformat.NotebookNode, heading: str, next_heading: str) -> list[str]:
    """The code cells (not [slow]) between two markdown headings."""
    cells, inside = [], False
    for cell in nb.cells:
        if cell.cell_type == "markdown" and cell.source.startswith((heading, next_heading)):
            inside = cell.source.startswith(heading)
        elif inside and cell.cell_type == "code" and not cell.source.lstrip().startswith("# [slow]"):
            cells.append(cell.source)
    return cells


def patched_model_namespace(nb_module, exercise, printed: io.StringIO | None = None) -> dict:
    """Section 5 of the exercise's notebook run in a copy of the notebook's namespace (the smoke preset's cfg); what
    its checks print goes to `printed`."""
    notebook = exercises.exercise_notebook(exercise)
    namespace = dict(vars(nb_module))
    with contextlib.redirect_stdout(printed or io.StringIO()):
        for source in section_cells(notebook, "## 5.", "## 6."):
            exec(compile(source, "section 5 (patched)", "exec"), namespace)  # noqa: S102
    return namespace


def test_the_settings_line_and_the_preset_warmup_are_the_notebooks(nb):
    baseline = exercises.exercise_notebook(exercises.EXERCISES["baseline"], seed=7)  # `cfg = make_config()`: once
    line = "\ncfg = make_config(**{'progress': False, 'seed': 7, 'time_budget_min': 1000000.0})\n"
    assert sum(line in c.source for c in baseline.cells if c.cell_type == "code") == 1
    assert nb.PRESETS["cpu"]["warmup_steps"] == exercises.PRESET_WARMUP


@pytest.mark.parametrize("name", [n for n, e in exercises.EXERCISES.items() if not e.patches])
def test_a_settings_exercise_is_a_valid_config(nb, name):
    settings = exercises.settings_of(exercises.EXERCISES[name], seed=1235)
    cfg = nb.make_config("cpu", **settings)
    assert all(getattr(cfg, k) == v for k, v in settings.items())
    assert cfg.time_budget_min == (1e6 if exercises.EXERCISES[name].fixed_epochs else nb.PRESETS["cpu"]["time_budget_min"])


def test_a_patch_that_no_longer_matches_fails_loudly():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    with pytest.raises(ValueError, match="occurs 0 times"):
        exercises.apply_patches(nb, [("no such line in the notebook", "")])
    with pytest.raises(ValueError, match=r"occurs \d\d+ times"):
        exercises.apply_patches(nb, [("import ", "")])


@pytest.mark.parametrize("name", [n for n, e in exercises.EXERCISES.items() if e.patches])
def test_a_code_exercise_patches_the_notebook_and_its_model_trains_and_decodes(nb, name):
    exercise = exercises.EXERCISES[name]
    ns = patched_model_namespace(nb, exercise)
    cfg = nb.cfg
    torch.manual_seed(0)
    plain, model = nb.build_model(cfg, nb.VOCAB), ns["build_model"](cfg, nb.VOCAB)
    count = {k: sum(p.numel() for p in m.parameters()) for k, m in (("plain", plain), ("patched", model))}
    extra = {"1-pre-norm": 2 * 2 * cfg.d_model,  # two LayerNorms, weight and bias
             "6-untied": 2 * nb.VOCAB * cfg.d_model,  # the source's embedding and the output matrix
             "7-learned-positions": cfg.max_positions * cfg.d_model, "8-no-causal-mask": 0}[name]
    assert count["patched"] - count["plain"] == extra, count

    optimizer = nb.make_optimizer(model, cfg)
    amp_dtype, scaler = None, torch.amp.GradScaler("cpu")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.train()
    losses = [nb.train_step(model, nb.train_batches[i], optimizer, scaler, amp_dtype, cfg, i + 1) for i in range(2)]
    assert all(math.isfinite(float(loss)) for loss in losses)
    moved = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
    new = {"1-pre-norm": {"encoder_norm.weight", "decoder_norm.bias"}, "6-untied": {"source_embedding.weight",
           "output.weight"}, "7-learned-positions": {"positions"}, "8-no-causal-mask": set()}[name]
    assert new <= moved, "the exercise's new parameters are not trained"

    model.eval()
    src = nb.corpus["validation"][0][:3]
    for beam in (1, 2):
        outputs = nb.decode_corpus(model, nb.tokenizer, src, cfg, torch.device("cpu"), beam=beam)
        assert len(outputs) == 3 and all(isinstance(o, str) for o in outputs)


def test_exercise_8_lets_the_decoder_read_the_future_and_the_notebooks_checks_catch_it(nb):
    """Without the causal mask, a target token changes the decoder's output at earlier positions (training reads the
    answer); section 5.8's check prints ✗, and the decoder's log-probabilities differ with and without the cache (what
    section 10's check compares), while the unpatched model's agree."""
    printed = io.StringIO()
    ns = patched_model_namespace(nb, exercises.EXERCISES["8-no-causal-mask"], printed)
    assert "✗ positions 0..3 ignore the future" in printed.getvalue()
    torch.manual_seed(0)
    src, tgt = torch.randint(4, nb.VOCAB, (2, 7)), torch.randint(4, nb.VOCAB, (2, 6))
    changed = tgt.clone()
    changed[:, -1] = (tgt[:, -1] - 3) % (nb.VOCAB - 4) + 4  # another last token
    for build, peeks in ((nb.build_model, False), (ns["build_model"], True)):
        model = build(nb.cfg, nb.VOCAB).eval()
        with torch.no_grad():
            gap = (model(src, tgt)[:, :-1] - model(src, changed)[:, :-1]).abs().max().item()
            memory, src_mask = model.encode(src)
            cache = nb.DecoderCache(model)
            for t in range(1, tgt.size(1) + 1):
                cached = nb.next_log_probs(model, tgt[:, :t], memory, src_mask, cache)
            uncached = nb.next_log_probs(model, tgt, memory, src_mask, None)
        assert (gap > 1e-3) == peeks, gap
        assert torch.allclose(cached, uncached, atol=1e-4) != peeks


def test_a_run_keeps_the_files_of_its_run_subfolder(tmp_path):
    """The notebook writes results.json and history.json into the run's subfolder of the work folder: the runner finds
    them there (the newest, if several) and copies them into the run's folder under results/exercises."""
    old, new = tmp_path / "work" / "cpu-1" / "run-a", tmp_path / "work" / "cpu-1" / "run-b"
    for folder, text in ((old, "old"), (new, "new")):
        folder.mkdir(parents=True)
        (folder / "results.json").write_text(text)
    (new / "history.json").write_text("history")
    exercises.keep_run_files(tmp_path / "work", tmp_path / "out")
    assert (tmp_path / "out" / "results.json").read_text() == "new"
    assert (tmp_path / "out" / "history.json").read_text() == "history"


def test_the_note_under_the_table_compares_the_baseline_with_the_published_run(tmp_path):
    base = {"run": "baseline", "threads": 1, "beam4": 38.45, "chosen_bleu": 39.18}
    (tmp_path / "results.json").write_text(json.dumps({"kept": "avg", "chosen_on_validation": "beam 8, alpha 1.4",
                                                       "bleu": {"avg, beam 4": 38.02, "avg, beam 8, alpha 1.4": 39.18}}))
    (tmp_path / "history.json").write_text(json.dumps({"val_nll": [2.0, math.log(5.53)]}))
    note = exercises.published_note([base], tmp_path)
    assert note.startswith("This notebook's published run (results/cpu), same preset and seed as `baseline` (1 thread), ")
    assert "perplexity 5.53, beam 4 38.02, but the same" in note
    other = exercises.published_note([{**base, "chosen_bleu": 39.5}], tmp_path)
    assert other.endswith("beam 4 38.02, and test score chosen on validation, 39.18.")
    assert exercises.published_note([], tmp_path) == exercises.published_note([base], tmp_path / "none") == ""


def test_the_exercises_table_and_figure_show_every_kind_of_run():
    """exercise_table and exercise_figure on made-up runs: a baseline of two seeds, an exercise within and below
    them, a diverged run, one without results, one off the left panel. Nothing is guessed: a run without a recorded
    choice shows none, and without a baseline there is no difference to show."""
    import matplotlib.pyplot as plt

    def row(run, exercise, **more):
        return {"run": run, "exercise": exercise, "what": exercise, "steps": 100, "cpu": "a CPU", "error": None,
                "val_nll": [], "epoch_step": [], **more}

    runs = [row("baseline", "baseline", val_nll=[3.0, 2.0], epoch_step=[50, 100], greedy=30.0, beam4=31.0,
                chosen="beam 8, alpha 1.4", chosen_bleu=31.5),
            row("baseline-seed7", "baseline", val_nll=[3.1, 2.1], epoch_step=[50, 100], greedy=30.5, beam4=32.0,
                chosen=None, chosen_bleu=32.0),
            row("3-no-label-smoothing", "3-no-label-smoothing", val_nll=[2.9, 1.9], epoch_step=[50, 100], greedy=29.0,
                beam4=30.0, chosen="beam 4, alpha 1", chosen_bleu=30.25),
            row("2-no-warmup", "2-no-warmup", error="TrainingDiverged: training diverged at step 40"),
            row("6-untied", "6-untied", val_nll=[5.0], epoch_step=[50]),
            row("7-learned-positions", "7-learned-positions", val_nll=[9.0], epoch_step=[50])]
    table = exercises.exercise_table(runs)
    assert "| `3-no-label-smoothing` | 3-no-label-smoothing | 100 | 6.69 | 29.00 | 30.00 | -1.50 (below) | 2 / 0 of 2 | beam 4, alpha 1: 30.25 |\n" in table
    assert "| `baseline-seed7` | baseline | 100 | 8.17 | 30.50 | 32.00 | +0.50 (in) | – | – |\n" in table
    assert "| `2-no-warmup` | 2-no-warmup | 100 | – | – | – | TrainingDiverged: training diverged at step 40 | – | – |" in table
    assert "| `6-untied` | 6-untied | 100 | 148.41 | – | – | no results.json | 0 / 1 of 1 | – |" in table
    assert "The baseline's 2 seeds: 31.00 to 32.00 at beam 4 (mean 31.50)." in table
    assert "Section 11's sweep: the choice on validation beats beam 4 (α 0.6) on test in 2 of 2 runs." in table
    fig, notes = exercises.exercise_figure(runs)
    base = [line for line in fig.axes[0].lines if line.get_color() == "k"]  # the baseline, drawn over the others
    assert base and all(g.get_zorder() > line.get_zorder() for g in base for line in fig.axes[0].lines if line not in base)
    assert {g.get_linestyle() for g in base if len(g.get_xdata()) > 1} == {"--"}  # dashed: seen among the others
    plt.close(fig)
    assert notes == ["Not on the left panel (no validation NLL below 7): 2-no-warmup, 7-learned-positions.",
                     "Leaving the right panel (more than 0.3 from the seeds' mean): 6-untied."]
    assert "| 30.00 | – | – | beam 4, alpha 1: 30.25 |" in exercises.exercise_table(runs[2:])  # no baseline yet


def test_the_notebook_shows_summary_jsons_runs_without_a_network(nb):
    """Section 13's cell of the runs is what `python tests/exercises.py notebook` makes of the committed summary.json
    (text and table exactly; the figure attached as a PNG), and no code cell reads the runs at run time."""
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    cell = next(c for c in notebook.cells if c.cell_type == "markdown" and c.source.startswith(exercises.NOTEBOOK_CELL))
    rows = json.loads((exercises.RESULTS / "summary.json").read_text(encoding="utf-8"))
    text, _ = exercises.exercise_markdown(rows)
    assert cell.source == text, "section 13's runs are not summary.json's: run `python tests/exercises.py notebook`"
    png = base64.b64decode(cell.get("attachments", {}).get(exercises.FIGURE, {}).get("image/png", ""))
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and f"(attachment:{exercises.FIGURE})" in cell.source
    assert not [c for c in notebook.cells if c.cell_type == "code" and "results/exercises" in c.source]


RUNS = sorted(exercises.RESULTS.glob("*/run.json"))


def test_the_summary_is_what_the_run_folders_hold():
    assert RUNS, "no exercise run is committed under results/exercises"
    written = json.loads((exercises.RESULTS / "summary.json").read_text(encoding="utf-8"))
    assert written == exercises.summary_rows(), "summary.json is stale: run `python tests/exercises.py summarize`"


@pytest.mark.parametrize("path", RUNS, ids=[p.parent.name for p in RUNS])
def test_each_run_is_its_exercise_as_defined_now(nb, path):
    """A committed run used the exercise's settings and edits as tests/exercises.py defines them, from committed
    code, on the whole test set; a fixed-epoch run trained all the `cpu` preset's epochs as they are now."""
    record = json.loads(path.read_text(encoding="utf-8"))
    exercise = exercises.EXERCISES[record["exercise"]]
    settings = exercises.settings_of(exercise, record["seed"])
    assert record["settings"] == settings and "uncommitted" not in record["commit"]
    code = "\n".join(c.source for c in nbformat.read(path.parent / "transformer.ipynb", as_version=4).cells
                     if c.cell_type == "code")
    assert f"\ncfg = make_config(**{settings!r})\n" in code
    assert all(new in code for _, new in exercise.patches)
    if record["error"] is None:
        results = json.loads((path.parent / "results.json").read_text())
        history = json.loads((path.parent / "history.json").read_text())
        assert results["preset"] == "cpu" and results["test_sentences"] == 1000
        if exercise.fixed_epochs:
            assert len(history["val_nll"]) == nb.PRESETS["cpu"]["epochs"], "not the preset's epochs: run it again"


def test_the_runs_readme_quotes_every_exercise_run_exactly():
    """results/exercises/README.md holds the table of every run, exactly as summary.json gives it."""
    rows = json.loads((exercises.RESULTS / "summary.json").read_text(encoding="utf-8"))
    table = exercises.markdown_table(rows)
    assert table in (exercises.RESULTS / "README.md").read_text(encoding="utf-8"), (
        "results/exercises/README.md's table is not summary.json's: paste `python tests/exercises.py table` into it")


def test_exercise_8_lets_a_position_see_the_target_it_must_predict(nb):
    """The bug of exercise 8: without the causal mask, the logits at position 0 change with the token at position 1,
    the very token position 0 is trained to predict (teacher forcing); with the mask they do not."""
    ns = patched_model_namespace(nb, exercises.EXERCISES["8-no-causal-mask"])
    batch = nb.train_batches[0]
    src, tgt = batch.src[:1], batch.tgt_in[:1].clone()
    other = tgt.clone()
    other[0, 1] = (tgt[0, 1] + 1) % nb.VOCAB if tgt[0, 1] + 1 != nb.PAD else 5
    for build, peeks in ((nb.build_model, False), (ns["build_model"], True)):
        torch.manual_seed(0)
        model = build(nb.cfg, nb.VOCAB).eval()
        with torch.no_grad():
            gap = (model(src, tgt)[0, 0] - model(src, other)[0, 0]).abs().max().item()
        assert (gap > 1e-4) == peeks, (build, gap)


def test_the_results_cells_seed_range_is_the_tables(nb):
    """Section 13's verdict places the headline against the `cpu` seeds' beam 4: the numbers of summary.json."""
    rows = json.loads((ROOT / "results" / "exercises" / "summary.json").read_text(encoding="utf-8"))
    seeds = [r["beam4"] for r in rows if r["exercise"] == "baseline"]
    assert len(seeds) == 3 and nb.SEEDS_BEAM4["cpu"] == (min(seeds), max(seeds))


def verdict_lines(path) -> list[str]:
    """The ✓/✗ lines an executed notebook printed, in order."""
    printed = common.stream_text(nbformat.read(path, as_version=4))
    return [line for line in printed.splitlines() if line.startswith(("✓", "✗"))]


EXERCISE_8_CROSSES = {  # the checks section 13's answer to exercise 8 names, as each ✗ line begins
    "✗ positions 0..3 ignore the future": "section 5.8's",
    "✗ the toy model copies a sentence it has never seen": "the copy task's",
    "✗ the outputs match their own references better than the next sentence's": "section 10's own-against-next",
    "✗ no self-attention weight on the future": "section 12's two",
    "✗ cross-attention does not park": "section 12's two",
    "✗ the headline is above the lowest": "the headline's",
}


def test_exercise_8s_answer_names_the_crosses_its_run_printed():
    """Section 13's answer to exercise 8 names the checks that print ✗, and how many: those its run's executed copy
    shows, and that copy ran today's checks (as many verdicts as the published run of the notebook, results/cpu)."""
    run = verdict_lines(exercises.RESULTS / "8-no-causal-mask" / "transformer.ipynb")
    assert len(run) == len(verdict_lines(ROOT / "results" / "cpu" / "transformer.ipynb")), (
        "exercise 8's run has other checks than the notebook's published run: run it again")
    crosses = [line for line in run if line.startswith("✗")]
    named = [next((k for k in EXERCISE_8_CROSSES if line.startswith(k)), line) for line in crosses]
    assert named == list(EXERCISE_8_CROSSES), "exercise 8's run printed other ✗ lines: update its answer and this list"
    answer = next(c.source for c in nbformat.read(NOTEBOOK, as_version=4).cells
                  if c.cell_type == "markdown" and "**No causal mask**" in c.source)
    words = ["No", "One", "Two", "Three", "Four", "Five", "Six", "Seven", "Eight", "Nine", "Ten", "Eleven", "Twelve"]
    assert f"{words[len(crosses)]} checks print ✗" in answer and all(name in answer for name in EXERCISE_8_CROSSES.values())
