"""Section 1, configuration and presets: the settings Config refuses, the presets and what make_config takes from
the environment, and the work folder."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest


# ---------------------------------------------------------------- settings that are refused (check_config)
@pytest.mark.parametrize(("overrides", "message"), [
    ({"d_model": 250, "n_heads": 4}, "d_model=250 is not divisible by n_heads=4"),
    ({"d_model": 33, "n_heads": 3}, "must be even"),
    ({"encoder_layers": 0}, "encoder_layers=0 must be at least 1"),
    ({"average_last": 0}, "average_last=0 must be at least 1"),  # [-0:] would have averaged every epoch
    ({"dropout": 1.0}, "dropout and label_smoothing"),
    ({"max_tokens": 64, "max_len": 128}, "max_tokens=64 cannot hold"),
    ({"dataset": "wmt14"}, "dataset='wmt14' is unknown"),
    ({"max_len": 100, "max_positions": 100}, r"max_positions=100 must be at least 104: max_len rounded up to a multiple of 8"),
    ({"max_len": 16, "max_positions": 52}, r"max_positions=52 must be at least 53: .*max_extra_len \+ 3"),  # 50 + <bos>, <eos>
])
def test_invalid_config_is_refused(nb, overrides, message):
    with pytest.raises(ValueError, match=message):
        nb.make_config("iwslt14", **overrides)


@pytest.mark.parametrize(("overrides", "message"), [
    ({"max_eval_sentences": 0}, r"max_eval_sentences=0 leaves nothing.*None for no limit"),
    ({"max_train_pairs": 0}, r"max_train_pairs=0 leaves nothing.*None for no limit"),  # 0 does not mean "no limit"
    ({"max_eval_sentences": -5}, "max_eval_sentences=-5"),  # [:-5] would drop the last five
    ({"n_heads": 0}, "n_heads=0 must be at least 1"),  # ZeroDivisionError inside Config
    ({"log_every": 0}, "log_every=0 must be at least 1"),  # ZeroDivisionError at the first step
    ({"time_budget_min": 0.0}, "time_budget_min=0.0 must be a number above 0"),  # ZeroDivisionError at step 0
    ({"lr_factor": 0.0}, "lr_factor=0.0 must be a number above 0"),  # trained nothing, silently
    ({"lr_factor": float("nan")}, "lr_factor=nan"),
    ({"adam_betas": (1.0, 0.98)}, r"adam_betas=\(1.0, 0.98\) must be two numbers in \[0, 1\)"),
])
def test_settings_that_leave_nothing_to_do_are_refused(nb, overrides, message):
    with pytest.raises(ValueError, match=message):
        nb.make_config("smoke", **overrides)


# ---------------------------------------------------------------- the presets, and make_config
@pytest.fixture
def clean_environment(monkeypatch):
    """make_config reads TRANSFORMER_*; the session fixture sets some of them, a user may set others."""
    for key in [k for k in os.environ if k.startswith("TRANSFORMER_")]:
        monkeypatch.delenv(key)


@pytest.mark.parametrize("preset", [None, "iwslt14"], ids=["default-on-a-gpu", "iwslt14"])
def test_default_preset_has_the_papers_settings(nb, clean_environment, monkeypatch, preset):
    """Label smoothing 0.1, dropout 0.1, Adam(0.9, 0.98, 1e-9), 4000 warmup steps (paper §5.3-5.4); beam 4, length
    penalty 0.6, output at most input + 50 (paper §6.1); the last 5 checkpoints averaged. With a GPU, iwslt14 is the
    default."""
    monkeypatch.setattr(nb.torch.cuda, "is_available", lambda: True)
    cfg = nb.make_config(preset)
    assert cfg.preset == "iwslt14" and cfg.dataset == "iwslt14" and cfg.data_dir is None
    assert (cfg.label_smoothing, cfg.dropout, cfg.attention_dropout) == (0.1, 0.1, 0.0)
    assert tuple(cfg.adam_betas) == (0.9, 0.98) and cfg.adam_eps == 1e-9
    assert cfg.warmup_steps == 4000 and cfg.lr_factor == 1.0
    assert (cfg.beam_size, cfg.length_penalty, cfg.max_extra_len) == (4, 0.6, 50)
    assert cfg.average_last == 5


def test_without_a_gpu_the_default_is_the_cpu_preset(nb, clean_environment, monkeypatch, capsys):
    """No GPU and no preset chosen: the cpu preset, with a message that says so and how to force another; an
    explicit choice (argument or TRANSFORMER_PRESET) is kept, even on a CPU."""
    monkeypatch.setattr(nb.torch.cuda, "is_available", lambda: False)
    assert nb.make_config().preset == "cpu"
    message = capsys.readouterr().out
    assert "No GPU" in message and "'cpu' preset" in message and "TRANSFORMER_PRESET" in message
    assert nb.make_config("iwslt14").preset == "iwslt14"
    monkeypatch.setenv("TRANSFORMER_PRESET", "iwslt14")
    assert nb.make_config().preset == "iwslt14"
    assert "No GPU" not in capsys.readouterr().out
    monkeypatch.setattr(nb.torch.cuda, "is_available", lambda: True)
    monkeypatch.delenv("TRANSFORMER_PRESET")
    assert nb.make_config().preset == "iwslt14"


def test_the_cpu_preset_is_multi30k_with_the_papers_architecture(nb, clean_environment):
    """cpu trains on Multi30k within a 20-minute budget, post-norm with tied embeddings as every preset, and keeps
    the paper's regularisation and decoding settings."""
    cfg = nb.make_config("cpu")
    assert cfg.dataset == "multi30k" and cfg.time_budget_min <= 20
    assert (cfg.label_smoothing, cfg.dropout, cfg.attention_dropout) == (0.1, 0.1, 0.0)
    assert (cfg.beam_size, cfg.length_penalty, cfg.max_extra_len) == (4, 0.6, 50)


def test_no_preset_drops_attention_weights(nb, clean_environment):
    """Dropout goes on sub-layer outputs and embedding + position sums only (paper §5.4): every preset keeps
    attention_dropout at 0.0."""
    for preset in nb.PRESETS:
        assert nb.make_config(preset).attention_dropout == 0.0, preset


def test_changed_settings_get_their_own_work_folder(nb, clean_environment):
    """With no TRANSFORMER_WORK_DIR, the tokenizer's folder is named after the preset and a hash of the data settings,
    and a training run's folder in it after its fingerprint (every setting a checkpoint must match), both derived when
    used: a setting changed in PRESETS, on cfg by attribute or by dataclasses.replace trains in a fresh folder, the
    first run's stays, the same settings find their checkpoint again, and only a data setting trains a new
    tokenizer."""
    base = nb.make_config("smoke")
    folder = nb.run_folder(base)

    def run(cfg):
        return nb.run_folder(cfg, nb.model_fingerprint(cfg, "the data"))

    assert base.work_dir == "" and folder.parts[0] == "runs" and folder.name.startswith("smoke-")
    assert run(base).parent == folder and run(nb.make_config("smoke")) == run(base)
    assert run(nb.make_config("smoke", d_model=32)) != run(base)
    assert nb.run_folder(nb.make_config("smoke", d_model=32)) == folder  # the same data: the same tokenizer
    assert run(nb.make_config("smoke", epochs=20)) == run(base)  # training longer resumes
    assert run(dataclasses.replace(base, label_smoothing=0.0)) != run(base)
    changed = dataclasses.replace(base)
    changed.vocab_size = 2000
    assert nb.run_folder(changed) != folder and run(changed) != run(base) and nb.run_folder(base) == folder


def test_the_settings_a_checkpoint_must_match_are_marked_in_config(nb):
    """RESUME_KEYS are the Config fields marked resume(...): the data's shape, the model's sizes, every training
    setting that changes the weights and the seed; not the epochs, budget, decoding or bookkeeping, which a resumed
    run may change."""
    assert set(nb.RESUME_KEYS) == {
        "src_lang", "tgt_lang", "vocab_size", "max_len", "encoder_layers", "decoder_layers", "d_model", "d_ff",
        "n_heads", "max_tokens", "seed", "dropout", "attention_dropout", "label_smoothing", "warmup_steps",
        "lr_factor", "adam_betas", "adam_eps"}
    assert nb.Config().adam_betas == (0.9, 0.98) and nb.Config().vocab_size == 10_000  # resume() keeps the default


@pytest.mark.parametrize(("value", "bars"), [(None, True), ("1", True), ("0", False)])
def test_progress_bars_are_a_setting_read_from_the_environment(nb, clean_environment, monkeypatch, value, bars):
    """TRANSFORMER_PROGRESS=0 turns the bars off (headless runs); cfg.progress can be changed, and does not change
    the work folder."""
    if value is not None:
        monkeypatch.setenv("TRANSFORMER_PROGRESS", value)
    cfg = nb.make_config("smoke")
    assert cfg.progress is bars
    assert nb.run_folder(dataclasses.replace(cfg, progress=not bars)) == nb.run_folder(cfg)


def test_unknown_preset_names_the_choices(nb):
    with pytest.raises(ValueError, match=r"unknown preset 'bogus'.*smoke, cpu, multi30k, iwslt14.*TRANSFORMER_PRESET"):
        nb.make_config("bogus")


def test_unknown_preset_from_the_environment(nb, monkeypatch):
    monkeypatch.setenv("TRANSFORMER_PRESET", "iwslt15")
    with pytest.raises(ValueError, match="unknown preset 'iwslt15'"):
        nb.make_config()


def test_environment_chooses_preset_data_and_work_dir(nb, monkeypatch, tmp_path):
    monkeypatch.setenv("TRANSFORMER_PRESET", "multi30k")
    monkeypatch.setenv("TRANSFORMER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("TRANSFORMER_WORK_DIR", str(tmp_path / "work"))
    cfg = nb.make_config()
    assert (cfg.preset, cfg.data_dir, cfg.work_dir, cfg.vocab_size) == (
        "multi30k", str(tmp_path / "data"), str(tmp_path / "work"), 8000)


def test_preset_from_environment_ignores_case_and_spaces(nb, monkeypatch):
    """TRANSFORMER_PRESET is trimmed and lowercased: ' Smoke ' (a space pasted into a Colab form), 'SMOKE' and
    'smoke' with a trailing newline all mean smoke; an empty TRANSFORMER_PRESET means the same as none."""
    for name in ("TRANSFORMER_DATA_DIR", "TRANSFORMER_WORK_DIR", "TRANSFORMER_PRESET"):
        monkeypatch.delenv(name, raising=False)
    unset = nb.make_config()
    monkeypatch.setenv("TRANSFORMER_PRESET", "")
    assert nb.make_config() == unset
    smoke = nb.make_config("smoke")
    for value in (" Smoke ", "SMOKE", "smoke\n"):
        monkeypatch.setenv("TRANSFORMER_PRESET", value)
        cfg = nb.make_config()
        assert cfg.preset == "smoke" and cfg == smoke, value


# ---------------------------------------------------------------- the work folder
def test_prepare_work_dir_creates_the_folder(nb, tmp_path):
    """prepare_work_dir creates the work folder, parents too, and returns it."""
    cfg = nb.make_config("smoke", work_dir=str(tmp_path / "a" / "b" / "work"))
    path = nb.prepare_work_dir(cfg)
    assert Path(path).resolve() == (tmp_path / "a" / "b" / "work").resolve()
    assert (tmp_path / "a" / "b" / "work").is_dir()


def test_work_dir_that_is_a_file(nb, tmp_path):
    """TRANSFORMER_WORK_DIR naming a file: prepare_work_dir raises NotADirectoryError naming TRANSFORMER_WORK_DIR."""
    (tmp_path / "work").write_text("not a folder")
    with pytest.raises(NotADirectoryError, match="TRANSFORMER_WORK_DIR"):
        nb.prepare_work_dir(nb.make_config("smoke", work_dir=str(tmp_path / "work")))


def test_every_check_ends_in_one_verdict_line(nb, capsys):
    """verdict() prints "✓ what: numbers" when the check holds and "✗ what: numbers" when it does not, so that a
    failing check stands out (the smoke run counts the ✓ lines, tests/test_end_to_end.py)."""
    nb.verdict(True, "two equals two", "2 vs 2")
    nb.verdict(False, "one equals two", "1 vs 2")
    nb.verdict(True, "no numbers")
    assert capsys.readouterr().out == "✓ two equals two: 2 vs 2\n✗ one equals two: 1 vs 2\n✓ no numbers\n"
