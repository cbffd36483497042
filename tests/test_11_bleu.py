"""Section 11, BLEU and checkpoint averaging: corpus_bleu against sacreBLEU's command line, the headline
tokenization, which weight files are averaged (damaged ones left out), and the evaluation cells run past damaged
files."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys

import matplotlib.pyplot as plt
import pytest
import torch
from helpers import CPU, messages, small_setup, tiny_weights, truncate_to_half


# ---------------------------------------------------------------- BLEU (corpus_bleu, headline_tokenize)
def sacrebleu_cli() -> list[str]:
    exe = shutil.which("sacrebleu")
    return [exe] if exe else [sys.executable, "-m", "sacrebleu"]


def test_corpus_bleu_equals_the_sacrebleu_command_line(nb, tmp_path):
    refs = nb.corpus["test"][1][:300]
    hyps = []
    for i, ref in enumerate(refs):  # deterministic damage of various kinds
        words = ref.split()
        if i % 4 == 0:
            words = words[::2]
        elif i % 4 == 1:
            words = words[1:] + words[:1]
        elif i % 4 == 2:
            words = [w.lower() for w in words]
        hyps.append(" ".join(words))
    hyps[5] = ""
    ref_file, hyp_file = tmp_path / "ref.en", tmp_path / "hyp.en"
    ref_file.write_text("\n".join(refs) + "\n", encoding="utf-8")
    hyp_file.write_text("\n".join(hyps) + "\n", encoding="utf-8")
    score, signature = nb.corpus_bleu(hyps, refs)
    out = subprocess.run([*sacrebleu_cli(), str(ref_file), "-i", str(hyp_file), "-b", "-w", "2"], capture_output=True, text=True,
                         check=True)
    cli_score = float(out.stdout.strip())
    assert 10 < score < 90  # a non-trivial case
    assert round(score, 2) == pytest.approx(cli_score, abs=0.005)
    assert round(nb.corpus_bleu(refs, refs)[0], 2) == 100.0
    assert "tok:13a" in signature and "nrefs:1" in signature and "case:mixed" in signature


def test_headline_bleu_on_tokenized_references_is_on_whitespace_tokens(nb):
    """For tokenized references (IWSLT14 as fairseq prepares it) the headline is sacreBLEU with tokenize="none",
    which differs from the default 13a (it re-splits '&apos;s' into '& apos ; s'); for detokenized references it
    is 13a. The signature names the tokenizer used."""
    import sacrebleu

    refs = ["it &apos;s not that i don &apos;t like it .", "we &apos;re here , and they &apos;ll come ."]
    hyps = ["it &apos;s not that i like it .", "we &apos;re here and they come ."]
    tokenize = nb.headline_tokenize(nb.text_style(refs * 50))
    assert tokenize == "none"
    score, signature = nb.corpus_bleu(hyps, refs, tokenize)
    assert score == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs], tokenize="none").score)
    assert abs(score - sacrebleu.corpus_bleu(hyps, [refs]).score) > 1.0
    assert "tok:none" in signature and "tok:13a" in nb.corpus_bleu(hyps, refs)[1]
    assert nb.headline_tokenize(nb.text_style(nb.corpus["test"][1])) == "13a"  # Multi30k: cased, detokenized


# ---------------------------------------------------------------- checkpoint averaging (average_weights)
def test_every_epoch_is_kept_and_the_snapshots_are_averaged(nb, tmp_path):
    """Every epoch's weights stay on disk (for the BLEU-per-epoch figure of section 11); the one average is that of
    the final-stretch snapshots, the last of which is the final weights."""
    cfg, model, train, valid = small_setup(nb, tmp_path, "avg", epochs=4, average_last=2)
    nb.train(model, train, valid, cfg, torch.device("cpu"), {})
    folder = nb.run_folder(cfg, {})  # the training run's folder, inside the work folder
    ckpt_dir = folder / "checkpoints"
    assert nb.weight_files(folder, "epoch") == [ckpt_dir / f"epoch{e}.pt" for e in (1, 2, 3, 4)]
    snapshots = nb.weight_files(folder, "snapshot")
    assert len(snapshots) == 2
    a, b = (torch.load(p, weights_only=True) for p in snapshots)
    averaged = nb.average_weights([a, b])
    assert torch.equal(b["embedding.weight"], model.state_dict()["embedding.weight"])
    for key in a:
        assert torch.allclose(averaged[key], (a[key].float() + b[key].float()) / 2)
    assert not torch.equal(averaged["embedding.weight"], b["embedding.weight"])


def test_an_average_leaves_out_a_damaged_member_and_names_it(nb, tmp_path):
    """candidate_weights reads each snapshot once: a truncated one is left out, named in a warning, and the rest are
    averaged, the label counting only them. (The whole evaluation: test_evaluation_cells_run_past_damaged_weight_files.)"""
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    for step in (20, 30, 40):
        torch.save(tiny_weights(float(step)), folder / f"snapshot{step}.pt")
    truncate_to_half(folder / "snapshot30.pt")
    with pytest.warns(UserWarning, match=re.escape(str(folder / "snapshot30.pt")) + ".*left out"):
        candidates = nb.candidate_weights(tiny_weights(0.0), tmp_path)
    assert list(candidates) == ["last", "final-stretch average of 2"]
    assert candidates["final-stretch average of 2"]["w"].tolist() == [30.0, 30.0]


# ---------------------------------------------------------------- the evaluation cells (evaluate, bleu_of_each_file)
def test_evaluation_cells_run_past_damaged_weight_files(nb, tmp_path):
    """Damaged epoch and snapshot files, and a last.pt damaged after training: the evaluation scores the weights
    training ended with (kept in memory) and the intact files, and the BLEU-per-epoch cell leaves the damaged files
    out; each names them in a warning."""
    ckpt_dir = tmp_path / "checkpoints"
    ckpt_dir.mkdir()
    model = nb.build_model(nb.cfg, nb.VOCAB)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    for name in ("epoch1.pt", "epoch2.pt", "epoch3.pt", "snapshot5.pt", "snapshot6.pt", "snapshot7.pt", "last.pt"):
        torch.save(weights, ckpt_dir / name)
    for name in ("epoch2.pt", "snapshot6.pt", "last.pt"):
        truncate_to_half(ckpt_dir / name)
    cfg = dataclasses.replace(nb.cfg, work_dir=str(tmp_path), max_eval_sentences=3, max_extra_len=3, average_last=3)
    corpus = {split: tuple(lines[:3] for lines in nb.corpus[split]) for split in nb.SPLITS}
    with pytest.warns(UserWarning) as record:
        candidates = nb.candidate_weights(weights, tmp_path)  # evaluate reads no file
    evaluation = nb.evaluate(model, candidates, corpus, nb.tokenizer, cfg, CPU, nb.STYLE, tmp_path)
    assert list(evaluation["valid_greedy"]) == ["last", "final-stretch average of 2"]
    assert any(str(ckpt_dir / "snapshot6.pt") in m for m in messages(record)), messages(record)
    assert json.loads((tmp_path / "results.json").read_text())["test_sentences"] == 3
    with pytest.warns(UserWarning) as record:
        scores = nb.bleu_of_each_file(model, weights, evaluation, nb.tokenizer, corpus, cfg, CPU, nb.STYLE, tmp_path)
    assert all(any(str(ckpt_dir / name) in m for m in messages(record)) for name in ("epoch2.pt", "snapshot6.pt"))
    assert sorted(scores["epoch"]) == [1, 3] and sorted(scores["snapshot"]) == [5, 7]
    nb.plot_bleu_of_each_file(scores, {"epoch_step": [10, 20, 30]}, evaluation)
    figure = plt.gcf()
    figure.canvas.draw()
    axes, (legend,) = figure.axes[0], figure.legends
    assert legend.get_window_extent().y1 <= axes.get_window_extent().y0  # under the axes: it hides no point
    plt.close("all")


def small_evaluation(nb, tmp_path):
    """An untrained model, its weights, a config that decodes 3 sentences of each split briefly, and that corpus."""
    model = nb.build_model(nb.cfg, nb.VOCAB)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = dataclasses.replace(nb.cfg, work_dir=str(tmp_path), max_eval_sentences=3, max_extra_len=3)
    corpus = {split: tuple(lines[:3] for lines in nb.corpus[split]) for split in nb.SPLITS}
    return model, weights, cfg, corpus


def test_the_chosen_beam_and_alpha_add_their_rows_and_are_marked(nb, tmp_path, capsys):
    """Section 11's sweep cell: score_choice decodes the test set with the beam and alpha chosen on validation
    sentences only (no greedy decoding again), adds the rows to `evaluation` and results.json, names the choice, and
    returns the kept weights' test BLEU with the choice and with the preset's beam (the cell prints both);
    section 13's table marks the kept weights' row. The preset's own beam and alpha decode nothing again. A new
    evaluate (other weights: a run trained on) starts the rows afresh."""
    model, weights, cfg, corpus = small_evaluation(nb, tmp_path)
    candidates = nb.candidate_weights(weights, tmp_path)  # no snapshots: the last weights alone
    evaluation = nb.evaluate(model, candidates, corpus, nb.tokenizer, cfg, CPU, nb.STYLE, tmp_path)
    assert sorted(evaluation["bleu"]) == ["last, beam 4", "last, greedy"]
    capsys.readouterr()
    got = nb.score_choice(evaluation, 2, 1.0, model, candidates, corpus, nb.tokenizer, cfg, CPU, nb.STYLE, tmp_path)
    printed = capsys.readouterr().out
    assert got == (evaluation["bleu"]["last, beam 2, alpha 1"], evaluation["bleu"]["last, beam 4"])  # the cell prints both
    assert "beam 2, alpha 1: BLEU" in printed and "greedy: BLEU" not in printed  # one line per test-set decoding
    assert sorted(evaluation["bleu"]) == ["last, beam 2, alpha 1", "last, beam 4", "last, greedy"]
    written = json.loads((tmp_path / "results.json").read_text())
    assert written["bleu"] == evaluation["bleu"] and written["chosen_on_validation"] == "beam 2, alpha 1"
    nb.print_results(model, nb.TrainState(), evaluation, cfg, CPU)
    table = capsys.readouterr().out
    assert "| last | beam 2, alpha 1 (chosen on validation) |" in table
    assert "| last | beam 4 (the headline: kept weights, the preset's beam) |" in table
    got = nb.score_choice(evaluation, cfg.beam_size, cfg.length_penalty, model, candidates, corpus, nb.tokenizer, cfg,
                          CPU, nb.STYLE, tmp_path)
    assert "BLEU" not in capsys.readouterr().out and evaluation["chosen_on_validation"] == "beam 4"
    assert got == (evaluation["bleu"]["last, beam 4"],) * 2
    with torch.no_grad():
        other = {k: v + 1 if v.is_floating_point() else v for k, v in weights.items()}
    again = nb.evaluate(model, {"last": other}, corpus, nb.tokenizer, cfg, CPU, nb.STYLE, tmp_path)
    assert sorted(again["bleu"]) == ["last, beam 4", "last, greedy"] and "chosen_on_validation" not in again


def test_evaluate_and_the_sweep_read_no_weights_file(nb, tmp_path, monkeypatch, capsys):
    """candidate_weights reads the final stretch's snapshots once; evaluate and the sweep's score_choice decode with
    the candidates it made and read no weights file again (score_choice used to read and average them anew). Only
    the BLEU-per-file cell reads the files again, as it must to score each."""
    model, weights, cfg, corpus = small_evaluation(nb, tmp_path)
    (tmp_path / "checkpoints").mkdir()
    for name in ("snapshot5.pt", "snapshot6.pt"):
        torch.save(weights, tmp_path / "checkpoints" / name)
    reads, real_load = [], nb.load_weights
    monkeypatch.setattr(nb, "load_weights", lambda path: reads.append(path.name) or real_load(path))
    candidates = nb.candidate_weights(weights, tmp_path)
    assert reads == ["snapshot5.pt", "snapshot6.pt"] and list(candidates) == ["last", "final-stretch average of 2"]
    evaluation = nb.evaluate(model, candidates, corpus, nb.tokenizer, cfg, CPU, nb.STYLE, tmp_path)
    nb.score_choice(evaluation, 2, 1.0, model, candidates, corpus, nb.tokenizer, cfg, CPU, nb.STYLE, tmp_path)
    assert reads == ["snapshot5.pt", "snapshot6.pt"]
    assert {"last, beam 2, alpha 1", "final-stretch average of 2, beam 2, alpha 1"} <= set(evaluation["bleu"])


def test_each_decoding_is_done_and_scored_once(nb, tmp_path, monkeypatch):
    """evaluate decodes the validation sentences greedily once per candidate and the test set once per candidate and
    method, computing BLEU once per decoding when the headline is 13a; the sweep takes greedy's row from evaluate
    (it decodes beams 2, 4 and 8 only), and bleu_of_each_file takes evaluate's score for a file holding the last
    weights."""
    model, weights, cfg, corpus = small_evaluation(nb, tmp_path)
    (tmp_path / "checkpoints").mkdir()
    torch.save(weights, tmp_path / "checkpoints" / "epoch1.pt")  # the last weights, as after the last epoch
    decodes, scores, real_decode, real_bleu = [], [], nb.decode_corpus, nb.corpus_bleu
    monkeypatch.setattr(nb, "decode_corpus", lambda *args: decodes.append(args[2][0]) or real_decode(*args))
    monkeypatch.setattr(nb, "corpus_bleu", lambda *args: scores.append(args[2:]) or real_bleu(*args))
    evaluation = nb.evaluate(model, {"last": weights}, corpus, nb.tokenizer, cfg, CPU, "cased, detokenized", tmp_path)
    assert decodes == [corpus["validation"][0][0]] + [corpus["test"][0][0]] * 2  # one candidate: validation, 2 tests
    assert scores == [("13a",)] * 3
    decodes.clear()
    sweep = nb.beam_sweep(model, nb.tokenizer, corpus, cfg, CPU, nb.STYLE, evaluation)
    assert sweep[0][:3] == (1, None, evaluation["valid_greedy"]["last"][0]) and len(decodes) == 3 * 4
    decodes.clear()
    assert nb.bleu_of_each_file(model, weights, evaluation, nb.tokenizer, corpus, cfg, CPU, nb.STYLE, tmp_path) == {
        "epoch": {1: evaluation["valid_greedy"]["last"][0]}, "snapshot": {}}
    assert not decodes


def test_beam_and_alpha_are_chosen_on_the_sweep_with_ties_to_the_smaller(nb):
    """choose_decoding: the best BLEU among beams of 2 or more (greedy is no choice of beam and alpha, even when it
    scores best); a tie goes to the smaller beam, then to the smaller alpha."""
    rows = [(1, 0.6, 40.0, 1.0, 1.0), (2, 0.0, 30.0, 0.9, 1.0), (2, 0.6, 35.5, 0.95, 1.0), (4, 1.0, 35.5, 0.97, 1.0),
            (8, 0.6, 35.0, 0.96, 1.0), (2, 1.0, 35.5, 0.99, 1.0)]
    assert nb.choose_decoding(rows) == (2, 0.6, 35.5)
    assert nb.choose_decoding([*rows, (8, 1.0, 35.6, 1.0, 1.0)]) == (8, 1.0, 35.6)


def test_a_headline_of_zero_bleu_gets_its_cross(nb, capsys):
    """Section 13's verdict on the headline against the seeds' range: a run that translates nothing (BLEU 0.00, as
    exercise 8's) prints ✗; a score within 1 BLEU of the lowest seed prints ✓ (0.0 is falsy: the verdict was left
    out for it)."""
    cfg = nb.make_config("cpu")
    low = nb.SEEDS_BEAM4["cpu"][0]
    model = nb.build_model(nb.make_config("smoke"), 16)
    for score, mark in ((0.0, "✗"), (low - 0.5, "✓")):
        evaluation = {"bleu": {f"last, {nb.decoding_name(cfg)}": score}, "kept": "last", "style": "lowercased"}
        nb.print_results(model, nb.TrainState(), evaluation, cfg, CPU)
        lines = capsys.readouterr().out.strip().splitlines()
        assert lines[-1].startswith(f"{mark} the headline is above the lowest"), lines
