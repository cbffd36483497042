"""A tiny training set-up shared by the tests that train: the smoke model on 120 pairs in small batches."""

from __future__ import annotations

from pathlib import Path


def small_setup(nb, tmp_path: Path, name: str, **overrides):
    """(cfg, model, train batches, validation batches): a few training steps take well under a second. By default
    a checkpoint is written after every step (checkpoint_every_min ~ 0)."""
    settings = {"log_every": 2, "checkpoint_every_min": 1e-9, "max_tokens": 512, "warmup_steps": 20,
                "time_budget_min": 60.0, **overrides}
    cfg = nb.make_config("smoke", work_dir=str(tmp_path / name), **settings)
    src, tgt = (x[:120] for x in nb.data["train"])
    train = nb.make_batches(src, tgt, cfg.max_tokens)
    valid = nb.make_batches(*(x[:20] for x in nb.data["validation"]), cfg.max_tokens)
    nb.seed_everything(cfg.seed)
    return cfg, nb.build_model(cfg, nb.VOCAB), train, valid
