"""Section 9, loss curves: plot_losses on the history of a run that diverged (and the diverged model decoded and
scored after it)."""

from __future__ import annotations

import dataclasses
import math

import matplotlib.pyplot as plt
from helpers import CPU, small_setup


def test_later_cells_survive_a_diverged_runs_numbers(nb, tmp_path):
    """The loss-curve cell draws an exploded run's history (infinite perplexities are left out), and a diverged
    model decodes and scores."""
    history = {"step": [2, 4], "train_loss": [36.5, 524.5], "lr": [1e-3, 2e-3], "epoch_step": [4, 8],
               "val_loss": [800.0, math.inf], "val_nll": [800.0, float("nan")]}
    nb.plot_losses(history, nb.cfg, nb.VOCAB)
    plt.close("all")
    cfg, model, train, valid = small_setup(nb, tmp_path, "diverged-model", checkpoint_every_min=60.0, lr_factor=1000.0)
    assert nb.train(model, train, valid, cfg, CPU, {}).diverged
    texts = nb.corpus["test"][0][:3]
    short = dataclasses.replace(cfg, max_extra_len=5)
    for beam in (1, 2):
        hyps = nb.decode_corpus(model, nb.tokenizer, texts, short, CPU, beam)
        assert len(hyps) == 3 and math.isfinite(nb.corpus_bleu(hyps, nb.corpus["test"][1][:3])[0])
