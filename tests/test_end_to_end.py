"""The whole notebook, top to bottom, as a user runs it: in a real kernel on the smoke preset with no data folder
named (so it must find the Multi30k slice kept in tests/data) and a fresh work folder, the training and evaluation
cells run twice; on a data folder with awkward splits; and the notebook's pipeline (its cells, then train(), evaluate() and translate())
on each style of the IWSLT14 slice in tests/data/iwslt14."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import types
from pathlib import Path

import matplotlib.pyplot as plt
import nbformat
import pytest
from helpers import IWSLT14, NOTEBOOK, PRE_NORM, ROOT, SLICE, lines, write_split
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
from tools import common

BLEU_LINE = re.compile(r"BLEU = +(\d+\.\d+) on \d+ test sentences \(cased, detokenized references\)")


def text_of(cell: nbformat.NotebookNode) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.output_type == "stream")


def test_committed_notebook_is_clean():
    """No outputs, execution counts or Colab/widget metadata in the committed file."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code)
    assert not {"colab", "widgets", "accelerator"} & set(nb.metadata)


CHECKS = 48  # the checks a smoke run of the whole notebook prints, each one line from verdict(): "✓ ..." or "✗ ..."


def test_whole_notebook_runs_on_smoke_preset_training_and_evaluation_twice(gpu_dry_run):
    """The whole notebook on the smoke preset, the training cell and the evaluation cell each run twice in a row (as
    a user re-runs them; conftest.py marks the second run `re_run`): every check passes; training, the evaluation and
    the sweep give what they should; a cell that prints a check ends in its verdict line; and re-running leaves no duplicated state: the training cell resumes instead of
    training again, and the evaluation cell prints the same scores again. The kernel run is the GPU command's dry
    run (conftest.py), given this notebook: fresh work folder, no data folder named. (One kernel run for all three:
    each costs a minute.)"""
    out, _ = gpu_dry_run
    nb = nbformat.read(out / "transformer-smoke.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    output = "\n".join(text_of(c) for c in code)
    assert "train: 4,000 pairs, validation: 1,014 pairs, test: 1,000 pairs" in output  # the repository's slice, found alone
    assert "TqdmWarning" not in output  # stderr streams count too
    verdicts = re.findall(r"^[✓✗] .*$", output, flags=re.MULTILINE)  # every check's last line (verdict())
    assert not [v for v in verdicts if v.startswith("✗")], verdicts
    last_lines = [text_of(c).strip().splitlines()[-1] for c in code if re.search("^[✓✗] ", text_of(c), re.MULTILINE)]
    assert all(line[0] in "✓✗" for line in last_lines), last_lines  # a check cell ends in its verdict, nothing after
    again = [i for i, c in enumerate(code) if c.metadata.get("re_run")]
    assert len(again) == 2 and all(code[i].source == code[i - 1].source for i in again)
    (train_first, train_again), (evaluate_first, evaluate_again) = ((code[i - 1], code[i]) for i in again)
    once = "\n".join(text_of(c) for c in code if not c.metadata.get("re_run"))
    assert len(re.findall(r"^[✓✗] ", once, flags=re.MULTILINE)) == CHECKS, verdicts  # a check lost, or one added
    assert "resumed from" in text_of(train_again) and "epoch   1:" not in text_of(train_again)
    assert "epoch   1:" in text_of(train_first)
    history = json.loads((out / "history.json").read_text())
    assert history["train_loss"][-1] < history["train_loss"][0] - 1.0, "training loss did not fall"
    assert history["val_loss"][-1] < history["val_loss"][0], "validation loss did not fall"
    scores = [float(s) for s in BLEU_LINE.findall(text_of(evaluate_first))]
    assert len(scores) == 4, output[-3000:]  # the last weights and the final-stretch average; greedy and beam
    assert all(s > 1.0 for s in scores), scores
    assert BLEU_LINE.findall(text_of(evaluate_again)) == BLEU_LINE.findall(text_of(evaluate_first))
    assert "sacreBLEU signature: nrefs:1|case:mixed|eff:no|tok:13a" in output
    assert re.search(r"keeping the (last|final-stretch average of 3) weights for what follows "
                     r"\(greedy BLEU on 200 validation", output)
    sweep_cell = next(text_of(c) for c in code if "chosen on validation sentences" in text_of(c))
    beam, alpha = re.search(r"chosen on validation sentences: beam (\d+), alpha ([\d.]+)", sweep_cell).groups()
    rescored = [float(s) for s in BLEU_LINE.findall(sweep_cell)]  # the test set again, with the chosen beam and alpha
    results = json.loads((out / "results.json").read_text())
    assert set(results["bleu"].values()) == set(scores + rescored)
    chosen = f"beam {beam}" + ("" if float(alpha) == 0.6 else f", alpha {float(alpha):g}")
    assert results["chosen_on_validation"] == chosen
    if (int(beam), float(alpha)) == (4, 0.6):  # the default: section 11's first scores are the choice's
        assert not rescored
    else:  # the beam search only: the greedy rows are already there
        assert len(rescored) == 2 and results["bleu"][f"last, {chosen}"] == rescored[0], sweep_cell
    assert results["preset"] == "smoke" and results["test_sentences"] == 200


# ---------------------------------------------------------------- a data folder with awkward splits
def test_whole_notebook_runs_on_tiny_splits_and_a_huge_test_sentence(tmp_path, monkeypatch):
    """A data folder with a one-pair validation split and a test 'sentence' of 20,000 characters (a paragraph pasted
    as one line): every cell runs to the end and results.json is written."""
    data = tmp_path / "data"
    train = [(SLICE / f"train.{lang}").read_text(encoding="utf-8").split("\n")[:4000] for lang in ("de", "en")]
    write_split(data, "train", *train)
    write_split(data, "validation", *([lines[0]] for lines in train))
    write_split(data, "test", [("Ein Hund läuft. " * 1250)[:20000]], ["A dog runs."])
    work = tmp_path / "work"
    monkeypatch.setenv("TRANSFORMER_PRESET", "smoke")
    monkeypatch.setenv("TRANSFORMER_WORK_DIR", str(work))
    monkeypatch.setenv("TRANSFORMER_DATA_DIR", str(data))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    assert json.loads(common.newest(work, "results.json").read_text())  # in the run's folder under the work folder


# ---------------------------------------------------------------- the smoke pipeline on each style of IWSLT14
SHRUNK = {"epochs": 2, "warmup_steps": 8, "max_eval_sentences": 40, "max_extra_len": 10,  # seconds, not minutes
          "average_span": 0.5}  # 14 steps: the averaging snapshots over the last 7, so that there is an average


def run_pipeline(data_dir: Path, work: Path) -> types.ModuleType:
    """The notebook's pipeline on `data_dir` with the smoke preset: its cells (without the slow ones) build the
    data, the vocabulary and the batches; then what the slow cells call: train(), evaluate() and translate(), with
    the config shrunk. The module gets the `evaluation`."""
    from nbloader import load_notebook, notebook_environment

    name = f"iwslt14_smoke_{data_dir.name}"
    try:
        with notebook_environment("smoke", work, data_dir):
            m = load_notebook(name)
            cfg = dataclasses.replace(m.cfg, **SHRUNK)
            m.seed_everything(cfg.seed)
            model = m.build_model(cfg, m.VOCAB)
            fingerprint = m.model_fingerprint(cfg, m.corpus_fingerprint(m.corpus))
            state = m.train(model, m.train_batches, m.valid_batches, cfg, m.device, fingerprint)
            assert state.epoch == SHRUNK["epochs"], state
            last = {k: v.detach().clone() for k, v in model.state_dict().items()}
            m.trained_folder = m.run_folder(cfg, fingerprint)  # the run's folder: its snapshots, its results.json
            m.candidates = m.candidate_weights(last, m.trained_folder)
            m.evaluation = m.evaluate(model, m.candidates, m.corpus, m.tokenizer, cfg, m.device, m.STYLE, m.trained_folder)
            for sentence in ["Ein Mann fährt mit dem Fahrrad durch die Stadt.", *m.corpus["test"][0][:3]]:
                print(f"{sentence}\n  -> {m.translate(sentence, model, m.tokenizer, cfg, m.device, style=m.STYLE)}")
    finally:
        sys.modules.pop(name, None)
        plt.close("all")
    return m


@pytest.mark.parametrize("style, headline", [("hub", "13a"), ("tokenized", "none")])
def test_smoke_pipeline_on_real_iwslt14(style, headline, tmp_path, capsys):
    """The notebook's pipeline on the slice (14 steps, 40 sentences scored): it finds the style, scores with the
    right headline (13a on the Hub's text; whitespace tokens on fairseq's, with 13a beside) and names it, and
    translate() shows its outputs without Moses escapes."""
    module = run_pipeline(IWSLT14 / style, tmp_path / "work")
    out = capsys.readouterr().out
    found = "lowercased, detokenized" if style == "hub" else "lowercased, tokenized"
    assert f"reference text: {found}" in out
    assert module.corpus["test"] == (lines(style, "test", "de"), lines(style, "test", "en"))
    assert found == module.STYLE and module.evaluation["tokenize"] == headline
    scores = re.findall(rf"BLEU = +\d+\.\d+(?: \(13a: +\d+\.\d+\))? on 40 test sentences \({found} references\)", out)
    results = json.loads((module.trained_folder / "results.json").read_text())
    assert len(scores) == len(results["bleu"]) >= 4, out[-3000:]  # the last weights and an average, greedy and beam
    assert results["style"] == found and f"|tok:{headline}|" in results["signature"]
    shown = re.findall(r"\n  -> (.*)", out)  # translate()'s outputs
    assert len(shown) >= 3 and not any(re.search(r"&(apos|quot|amp|#91|#93);", line) for line in shown), shown
    if headline == "none":
        assert all("(13a: " in score for score in scores)  # 13a beside the score on whitespace tokens
    else:
        assert "(13a: " not in out and "13a signature" not in out




def test_a_student_re_running_cells_in_one_kernel(nb, tmp_path, monkeypatch):
    """One kernel, as a student uses it, with the default work folders (no TRANSFORMER_WORK_DIR): the cells up to
    training, then the training cell; a setting changed on cfg and the training cell re-run: a fresh folder, the
    first run's checkpoint stays; the residual class re-defined as pre-norm (same parameters, wired otherwise) and
    the training cell re-run: another folder, no missing keys, nothing resumed; the same class again: resumed; and
    a data setting (max_tokens) changed with only the training cell re-run: refused, naming the batching cell, and
    the advice followed, a fresh run; the cells after training, down to the evaluation, run on the trained model.
    Epochs are cut to 1 (they do not name folders)."""
    expected_code = nb.model_code(nb.build_model(nb.cfg, nb.VOCAB))  # the test loader's, on the same data
    monkeypatch.setenv("TRANSFORMER_PRESET", "smoke")
    monkeypatch.delenv("TRANSFORMER_WORK_DIR", raising=False)
    monkeypatch.setenv("TRANSFORMER_DATA_DIR", str(SLICE))
    monkeypatch.setenv("TRANSFORMER_PROGRESS", "0")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [i for i, cell in enumerate(nb.cells) if cell.cell_type == "code"]
    training, evaluation = common.training_cell(nb), common.evaluation_cell(nb)
    batching = common.cells_assigning(nb, "train_batches")[0]
    client = NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})

    def run(source: str) -> str:
        cell = nbformat.v4.new_code_cell(source)
        client.execute_cell(cell, 0)
        return text_of(cell)

    def train_again() -> str:
        nb.cells[training].outputs = []
        client.execute_cell(nb.cells[training], training)
        return text_of(nb.cells[training])

    def folder(output: str) -> Path:
        return tmp_path / re.search(r"training in (\S+)", output)[1]

    with client.setup_kernel():
        for i in code:
            if i == training:
                run("cfg.epochs = 1")
                break
            client.execute_cell(nb.cells[i], i)
        first = train_again()
        assert "resumed" not in first and (folder(first) / "checkpoints" / "last.pt").exists(), first[-2000:]
        in_kernel = run("print(model_code(trained_model))").strip()  # Jupyter's __main__ against the test loader's
        assert in_kernel == expected_code
        run("cfg.label_smoothing = 0.0")
        smoothing = train_again()
        assert folder(smoothing) != folder(first) and "resumed" not in smoothing, smoothing[-2000:]
        assert (folder(first) / "checkpoints" / "last.pt").exists()  # the first run stays
        run("cfg.label_smoothing = 0.1\n" + PRE_NORM)
        pre_norm = train_again()
        assert folder(pre_norm).parent == folder(first).parent and folder(pre_norm) != folder(first)
        assert "resumed" not in pre_norm and "Missing key" not in pre_norm, pre_norm[-2000:]
        again = train_again()
        assert folder(again) == folder(pre_norm) and "resumed from" in again, again[-2000:]
        run("cfg.max_tokens = 1024")  # a data setting, with only the training cell re-run: refused, naming the cell
        with pytest.raises(CellExecutionError, match=r"section 4's batching cell ran with max_tokens=1536, but cfg now "
                                                     r"says max_tokens=1024: re-run the cells from that one down"):
            train_again()
        for i in code:  # the advice followed: from the batching cell down, then training
            if batching <= i < training:
                client.execute_cell(nb.cells[i], i)
        smaller = train_again()
        assert folder(smaller) not in (folder(first), folder(pre_norm)) and "resumed" not in smaller, smaller[-2000:]
        for i in code:  # the cells after training, down to the evaluation, on the model just trained
            if training < i <= evaluation:
                client.execute_cell(nb.cells[i], i)
    assert json.loads((folder(smaller) / "results.json").read_text())["bleu"]
