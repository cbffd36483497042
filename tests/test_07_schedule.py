"""Section 7, Adam and the warmup schedule: transformer_lr and make_optimizer."""

from __future__ import annotations

import pytest
import torch

# ---------------------------------------------------------------- the learning-rate schedule (transformer_lr)
SCHEDULES = [(512, 4000), (256, 4000), (64, 200), (64, 50), (256, 7)]


@pytest.mark.parametrize("d_model, warmup", SCHEDULES)
def test_lr_peaks_exactly_at_warmup(nb, d_model, warmup):
    lr = lambda s: nb.transformer_lr(s, d_model, warmup)
    assert lr(warmup) == pytest.approx(d_model ** -0.5 * warmup ** -0.5, rel=1e-12)
    assert lr(warmup - 1) < lr(warmup) > lr(warmup + 1)
    assert max(range(1, 3 * warmup), key=lr) == warmup


@pytest.mark.parametrize("d_model, warmup", SCHEDULES)
def test_lr_warmup_is_linear_then_inverse_sqrt(nb, d_model, warmup):
    lr = lambda s: nb.transformer_lr(s, d_model, warmup)
    for s in sorted({1, 2, 3, warmup // 3 or 1, warmup // 2 or 1, warmup - 1 or 1, warmup}):
        assert lr(s) == pytest.approx(s * lr(1), rel=1e-9), f"step {s} of the warmup"
    for s in (warmup, warmup + 1, 2 * warmup, 10 * warmup, 100_000):
        assert lr(s) == pytest.approx(d_model ** -0.5 * s ** -0.5, rel=1e-9), f"step {s} after the warmup"
        assert lr(4 * s) == pytest.approx(lr(s) / 2, rel=1e-9)


@pytest.mark.parametrize("d_model, warmup", SCHEDULES)
def test_lr_step_one_is_the_first_step(nb, d_model, warmup):
    first = nb.transformer_lr(1, d_model, warmup)
    assert first > 0
    assert first == pytest.approx(d_model ** -0.5 * warmup ** -1.5, rel=1e-12)


def test_lr_factor_scales_the_schedule(nb):
    for s in (1, 37, 200, 5000):
        assert nb.transformer_lr(s, 64, 200, factor=2.0) == pytest.approx(2 * nb.transformer_lr(s, 64, 200), rel=1e-12)


# ---------------------------------------------------------------- Adam
def test_make_optimizer_is_adam_with_the_papers_settings(nb):
    cfg = nb.make_config("iwslt14")
    assert (cfg.d_model, cfg.warmup_steps, cfg.lr_factor) == (256, 4000, 1.0)
    model = nb.build_model(cfg, 64)  # a small vocabulary keeps this cheap; the sizes are the preset's
    optimizer = nb.make_optimizer(model, cfg)
    assert type(optimizer) is torch.optim.Adam
    assert len(optimizer.param_groups) == 1
    group = optimizer.param_groups[0]
    assert tuple(group["betas"]) == (0.9, 0.98)
    assert group["eps"] == 1e-9
    assert group["weight_decay"] == 0
    assert group["lr"] == pytest.approx(nb.transformer_lr(1, 256, 4000), rel=1e-12)
    optimised = {id(p) for p in group["params"]}
    assert optimised == {id(p) for p in model.parameters()}
