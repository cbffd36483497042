"""The set-up and section 1, configuration and presets: the settings Config refuses, the presets and what make_config
takes from the environment, the work folder and its run folders, and the set-up's hooks that name the cell to run."""

from __future__ import annotations

import dataclasses
import os

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
    """RESUME_KEYS are the Config fields marked decides_weights(...): the data's shape, the model's sizes, every
    training setting that changes the weights and the seed; not the epochs, budget, decoding or bookkeeping, which a
    resumed run may change."""
    assert set(nb.RESUME_KEYS) == {
        "src_lang", "tgt_lang", "vocab_size", "max_len", "encoder_layers", "decoder_layers", "d_model", "d_ff",
        "n_heads", "max_tokens", "seed", "dropout", "attention_dropout", "label_smoothing", "warmup_steps",
        "lr_factor", "adam_betas", "adam_eps"}
    assert nb.Config().adam_betas == (0.9, 0.98) and nb.Config().vocab_size == 10_000  # decides_weights() keeps the default


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


def test_settings_from_the_environment_for_headless_runs(nb, clean_environment, monkeypatch, capsys):
    """TRANSFORMER_SETTINGS, a JSON object of Config's fields, lies between the preset and make_config's arguments;
    make_config says what it sets, so that cell 6's list of changed settings is not read as the preset's own (a
    newcomer read the published run's time_budget_min 60 as the cpu preset's), not what its arguments replace
    (seed 8 here); without it, nothing is said."""
    monkeypatch.setenv("TRANSFORMER_SETTINGS", '{"time_budget_min": 60, "seed": 7}')
    cfg = nb.make_config("cpu", seed=8)
    assert (cfg.time_budget_min, cfg.seed, cfg.epochs) == (60, 8, nb.PRESETS["cpu"]["epochs"])
    assert capsys.readouterr().out == "TRANSFORMER_SETTINGS sets {'time_budget_min': 60} over the 'cpu' preset\n"
    monkeypatch.delenv("TRANSFORMER_SETTINGS")
    nb.make_config("cpu")
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("value", ['{"time_budget": 60}', "time_budget_min=60", "[60]", '{"time_budget_min": 60'])
def test_bad_settings_from_the_environment_are_named_with_the_fix(nb, clean_environment, monkeypatch, value):
    """An unknown field, not JSON, not an object, cut short: one error that quotes the value and shows the form."""
    monkeypatch.setenv("TRANSFORMER_SETTINGS", value)
    with pytest.raises(ValueError, match=r"TRANSFORMER_SETTINGS=.*JSON object of Config's fields, such as"):
        nb.make_config("cpu")


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


# ---------------------------------------------------------------- the work folder given by hand (Drive)
def test_a_work_folder_given_by_hand_keeps_one_folder_per_run(nb, clean_environment, monkeypatch, tmp_path):
    """TRANSFORMER_WORK_DIR (a Google Drive folder, say) holds the data folder, named after the preset and the data
    settings (the tokenizer is kept there), and in it one folder per training run, named after its fingerprint: a
    changed setting trains in another folder under the same work folder, and a reconnect with the same settings (a
    fresh make_config) finds the same folder again."""
    drive = tmp_path / "MyDrive" / "transformer-runs"
    monkeypatch.setenv("TRANSFORMER_WORK_DIR", str(drive))
    base = nb.make_config("smoke")

    def run(cfg):
        return nb.run_folder(cfg, nb.model_fingerprint(cfg, "the data"))

    data_folder = nb.run_folder(base)
    assert base.work_dir == str(drive) and data_folder.parent == drive and data_folder.name.startswith("smoke-")
    assert run(base).parent == data_folder and run(base).name.startswith("run-")
    assert run(nb.make_config("smoke")) == run(base)  # a reconnect: the same settings, the same folder
    for changed in ({"label_smoothing": 0.0}, {"warmup_steps": 1}, {"d_model": 32}):
        assert run(nb.make_config("smoke", **changed)).parent == data_folder, changed  # the same data folder
        assert run(nb.make_config("smoke", **changed)) != run(base), changed
    other_data = nb.run_folder(nb.make_config("smoke", vocab_size=2000))
    assert other_data.parent == drive and other_data != data_folder  # another tokenizer: another data folder
    cfg = dataclasses.replace(base, work_dir=str(tmp_path / "elsewhere"))
    assert nb.run_folder(cfg) == tmp_path / "elsewhere" / data_folder.name  # cfg.work_dir, set by hand, as well


def test_work_dir_that_is_a_file(nb, tmp_path):
    """TRANSFORMER_WORK_DIR naming a file: a NotADirectoryError names the file and TRANSFORMER_WORK_DIR."""
    (tmp_path / "work").write_text("not a folder")
    with pytest.raises(NotADirectoryError, match=r"work folder .*work is a file: set TRANSFORMER_WORK_DIR to a folder"):
        nb.run_folder(nb.make_config("smoke", work_dir=str(tmp_path / "work")))


def test_every_check_ends_in_one_verdict_line(nb, capsys):
    """verdict() prints "✓ what: numbers" when the check holds and "✗ what: numbers" when it does not, so that a
    failing check stands out (the smoke run counts the ✓ lines, tests/test_end_to_end.py)."""
    nb.verdict(True, "two equals two", "2 vs 2")
    nb.verdict(False, "one equals two", "1 vs 2")
    nb.verdict(True, "no numbers")
    assert capsys.readouterr().out == "✓ two equals two: 2 vs 2\n✗ one equals two: 1 vs 2\n✓ no numbers\n"


# ---------------------------------------------------------------- the set-up's hooks: the cell to run, named
@pytest.mark.parametrize(("name", "defined", "cell"), [
    ("trained_model", set(), "section 8's training cell"),
    ("state", {"corpus"}, "section 8's training cell"),
    ("history", set(), "section 8's training cell"),
    ("last_weights", set(), "section 8's training cell"),
    ("trained_folder", set(), "section 8's training cell"),
    ("evaluation", {"trained_model", "state"}, "section 11's evaluation cell"),
    ("candidates", {"trained_model"}, "section 11's evaluation cell"),
    ("candidates", set(), "section 8's training cell"),
    ("evaluation", set(), "section 8's training cell"),  # the evaluation cell cannot run before training either
    ("sweep", set(), None),  # a name no later cell makes: IPython's usual traceback
    ("tokenizr", set(), None),
])
def test_a_name_used_before_the_cell_that_makes_it_names_that_cell(nb, name, defined, cell):
    assert nb.cell_to_run(name, dict.fromkeys(defined)) == cell


def test_data_made_under_other_settings_is_refused_naming_the_first_cell_to_re_run(nb, monkeypatch):
    """The set-up's post_run_cell hook records, for corpus, tokenizer, data and train_batches, the settings cfg had
    when a cell gave the name a new object; check_data_settings (the training cell's) names the first cell to re-run
    when cfg's settings differ since, or when one of them was not made in this kernel. Nothing recorded (the cells
    run by exec, as here): nothing to refuse."""
    monkeypatch.setattr(nb, "MADE_WITH", {})
    cfg = nb.make_config("smoke")
    nb.check_data_settings(dataclasses.replace(cfg, max_tokens=1024))  # nothing recorded: no check
    namespace = {"cfg": cfg}
    for name in ("corpus", "tokenizer", "data", "train_batches"):  # the cells of sections 2-4, run in order
        namespace[name] = object()
        nb.record_data_settings(namespace)
    nb.check_data_settings(cfg)  # all made with cfg's settings
    nb.record_data_settings(namespace)  # cells that make none of them again (a plot, a check) record nothing new
    cfg.max_tokens = 1024
    with pytest.raises(RuntimeError, match=r"section 4's batching cell ran with max_tokens=1536, but cfg now says "
                                           r"max_tokens=1024: re-run the cells from that one down"):
        nb.check_data_settings(cfg)
    namespace["train_batches"] = object()  # the batching cell re-run
    nb.record_data_settings(namespace)
    nb.check_data_settings(cfg)
    cfg.vocab_size = 2000  # then the tokenizer cell re-run, and the batching cell, but not the encoding cell
    for name in ("tokenizer", "train_batches"):
        namespace[name] = object()
        nb.record_data_settings(namespace)
    with pytest.raises(RuntimeError, match=r"section 3's `data = encode_corpus\(...\)` cell ran with vocab_size=1000, "):
        nb.check_data_settings(cfg)
    for name in ("data", "train_batches"):
        namespace[name] = object()
        nb.record_data_settings(namespace)
    nb.check_data_settings(cfg)
    cfg.dataset = "iwslt14"  # ignored while data_dir is set (the smoke preset reads the repository's slice)
    nb.check_data_settings(cfg)
    cfg.data_dir = None
    with pytest.raises(RuntimeError, match=r"section 2's `corpus = load_corpus\(cfg\)` cell ran with source='tests/data"
                                           r"/multi30k', but cfg now says source='iwslt14'"):
        nb.check_data_settings(cfg)
    del nb.MADE_WITH["train_batches"]  # a kernel in which section 4 has not run
    cfg.data_dir = "tests/data/multi30k"
    with pytest.raises(RuntimeError, match=r"section 4's batching cell has not run in this kernel: run the cells from"):
        nb.check_data_settings(cfg)


def test_in_a_kernel_a_cell_run_before_training_names_the_training_cell():
    """In a real kernel (nbclient): the set-up's cells registered, a cell using trained_model shows one line naming
    section 8's training cell, not a traceback; `evaluation` with trained_model present names section 11's evaluation
    cell; another NameError keeps IPython's traceback; and the post_run_cell hook records the data a cell makes."""
    import nbformat
    from helpers import NOTEBOOK
    from nbclient import NotebookClient
    from nbloader import code_cells

    sources = [*code_cells(until="## 2."), "print(trained_model)", "trained_model = 1\nevaluation",
               "print(no_such_name)", "corpus = ['a corpus']", "print(sorted(MADE_WITH))"]  # the set-up, section 1
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in sources])
    NotebookClient(notebook, timeout=120, allow_errors=True, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    errors = [[o for o in cell.outputs if o.output_type == "error"] for cell in notebook.cells[-5:]]
    assert not any(o.output_type == "error" for cell in notebook.cells[:-5] for o in cell.outputs)
    assert [len(e) for e in errors] == [1, 1, 1, 0, 0], errors
    assert errors[0][0].traceback == ["NameError: name 'trained_model' is not defined: run section 8's training cell first"]
    assert errors[1][0].traceback == ["NameError: name 'evaluation' is not defined: run section 11's evaluation cell first"]
    assert len(errors[2][0].traceback) > 1 and "no_such_name" in "".join(errors[2][0].traceback)  # IPython's own
    assert notebook.cells[-1].outputs[0].text == "['corpus']\n"  # recorded by the hook, with cfg's settings
