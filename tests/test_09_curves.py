"""Section 9, loss curves: plot_losses on the history of a run that diverged (and the diverged model decoded and
scored after it)."""

from __future__ import annotations

import dataclasses
import json
import math

import matplotlib.pyplot as plt
from helpers import CPU, ROOT, small_setup


def test_later_cells_survive_a_diverged_runs_numbers(nb, tmp_path):
    """The loss-curve cell draws an exploded run's history (infinite perplexities are left out), and a diverged
    model decodes and scores."""
    history = {"step": [2, 4], "train_loss": [36.5, 524.5], "lr": [1e-3, 2e-3], "epoch_step": [4, 8],
               "val_loss": [800.0, math.inf], "val_nll": [800.0, float("nan")]}
    nb.plot_losses(history, nb.cfg, nb.VOCAB, unigram=6.0)
    plt.close("all")
    cfg, model, train, valid = small_setup(nb, tmp_path, "diverged-model", checkpoint_every_min=60.0, lr_factor=1000.0)
    assert nb.train(model, train, valid, cfg, CPU, {}).diverged
    texts = nb.corpus["test"][0][:3]
    short = dataclasses.replace(cfg, max_extra_len=5)
    for beam in (1, 2):
        hyps = nb.decode_corpus(model, nb.tokenizer, texts, short, CPU, beam)
        assert len(hyps) == 3 and math.isfinite(nb.corpus_bleu(hyps, nb.corpus["test"][1][:3])[0])


def test_the_unigram_yardstick_is_the_cross_entropy_of_training_frequencies(nb):
    """By hand: targets <bos> 5 5 6 <eos> train it; counts + 0.5 over V = 8 tokens (<bos> never counted)."""
    bos, eos = nb.BOS, nb.EOS
    counts = [0.5] * 8
    for t in (5, 5, 6, eos):
        counts[t] += 1
    expected = -(math.log(counts[5] / sum(counts)) + math.log(counts[eos] / sum(counts))) / 2  # valid: 5 <eos>
    assert math.isclose(nb.unigram_nll([[bos, 5, 5, 6, eos]], [[bos, 5, eos]], 8), expected, rel_tol=1e-6)


def test_a_model_stalled_at_the_unigram_level_fails_the_loss_check(nb, capsys):
    """Exercise 2's stalled run (validation NLL 5.83 against the unigram model's 5.79) passed the old check, a
    perplexity under V / 10; a learning model's NLL lies more than a nat below the unigram model's."""
    for nll, mark in ((5.83, "✗"), (5.0, "✗"), (1.7, "✓")):
        history = {"step": [1], "train_loss": [5.9], "lr": [1e-4], "epoch_step": [616], "val_loss": [nll + 0.8],
                   "val_nll": [nll]}
        nb.plot_losses(history, nb.cfg, nb.VOCAB, unigram=5.79)
        plt.close("all")
        assert capsys.readouterr().out.splitlines()[-1].startswith(mark + " validation NLL over a nat below"), nll


def test_the_loss_figures_legend_hides_no_training_reading(nb):
    """The published run's history drawn: no reading of the training line lies under the legend's box (a label
    twice as long once spread the box over the curve's steep first steps)."""
    history = json.loads((ROOT / "results" / "cpu" / "history.json").read_text())
    nb.plot_losses(history, nb.cfg, nb.VOCAB, unigram=5.79)
    figure = plt.gcf()
    figure.canvas.draw()
    axes = figure.axes[0]
    box = axes.get_legend().get_window_extent()
    points = axes.transData.transform(list(zip(history["step"], history["train_loss"], strict=True)))
    hidden = [(s, loss) for (x, y), s, loss in zip(points, history["step"], history["train_loss"], strict=True)
              if box.x0 <= x <= box.x1 and box.y0 <= y <= box.y1]
    plt.close("all")
    assert not hidden, f"{len(hidden)} training readings under the legend, the first {hidden[0]}"
