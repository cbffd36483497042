"""Never lose a run, never give a silent wrong result: resuming, checkpoints, the time budget, the
non-finite guard, chunked decoding, and a clear error for every kind of bad input."""

from __future__ import annotations

import inspect
import math
import random
import re
import signal
import sys
import types
import warnings
from pathlib import Path

import pytest
import torch
from training_setup import small_setup

SLICE = Path(__file__).resolve().parent / "data" / "multi30k"


# ---------------------------------------------------------------- bad input gets a clear error
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


@pytest.mark.parametrize(("overrides", "message"), [
    ({"d_model": 250, "n_heads": 4}, "d_model=250 is not divisible by n_heads=4"),
    ({"d_model": 33, "n_heads": 3}, "must be even"),
    ({"encoder_layers": 0}, "encoder_layers=0 must be at least 1"),
    ({"average_last": 0}, "average_last=0 must be at least 1"),  # [-0:] would have averaged every epoch
    ({"dropout": 1.0}, "dropout and label_smoothing"),
    ({"max_tokens": 64, "max_len": 128}, "max_tokens=64 cannot hold"),
    ({"dataset": "wmt14"}, "dataset='wmt14' is unknown"),
    ({"max_len": 100, "max_positions": 100}, r"max_positions=100 .* multiple of 8 \(104\)"),  # batches pad to 104
    ({"max_positions": 52}, r"max_extra_len \+ 3 \(53\)"),
])
def test_invalid_config_is_refused(nb, overrides, message):
    with pytest.raises(ValueError, match=message):
        nb.make_config("iwslt14", **overrides)


def write_folder(folder: Path, sizes: dict[str, tuple[int, int]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for split, (n_de, n_en) in sizes.items():
        (folder / f"{split}.de").write_text("".join(f"Satz {i}\n" for i in range(n_de)), encoding="utf-8")
        (folder / f"{split}.en").write_text("".join(f"sentence {i}\n" for i in range(n_en)), encoding="utf-8")
    return folder


def test_missing_data_folder(nb, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"does not exist: TRANSFORMER_DATA_DIR must name a folder"):
        nb.read_parallel_folder(tmp_path / "nowhere")


def test_missing_split_file(nb, tmp_path):
    folder = write_folder(tmp_path / "d", {"train": (3, 3), "validation": (2, 2)})
    with pytest.raises(FileNotFoundError, match=r"test\.de is missing"):
        nb.read_parallel_folder(folder)


def test_misaligned_files_name_both_files_and_counts(nb, tmp_path):
    folder = write_folder(tmp_path / "d", {"train": (3, 3), "validation": (5, 4), "test": (2, 2)})
    with pytest.raises(ValueError, match=r"validation\.de has 5 lines but .*validation\.en has 4"):
        nb.read_parallel_folder(folder)


def test_empty_split(nb, tmp_path):
    folder = write_folder(tmp_path / "d", {"train": (3, 3), "validation": (2, 2), "test": (0, 0)})
    with pytest.raises(ValueError, match=r"test\.de and .*test\.en are empty"):
        nb.read_parallel_folder(folder)


def test_folder_lines_are_read_exactly(nb, tmp_path):
    """Split on '\\n' only: a Unicode line separator inside a sentence must not break the alignment. Leading
    whitespace stays; trailing whitespace (and a Windows '\\r') goes."""
    folder = write_folder(tmp_path / "d", {"train": (2, 2), "validation": (1, 1), "test": (1, 1)})
    (folder / "train.de").write_text("a\u2028b\r\n  c \n", encoding="utf-8")
    corpus = nb.read_parallel_folder(folder)
    assert corpus["train"][0] == ["a\u2028b", "  c"]


def test_unreachable_hub_explains_offline_use(nb, monkeypatch):
    monkeypatch.setattr(nb, "check_hub", lambda: None)  # the Hub answers, but the loader fails

    def refuse(*args, **kwargs):
        raise ConnectionError("no route to huggingface.co")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=refuse))
    with pytest.raises(ConnectionError, match=r"Hugging Face Hub.*TRANSFORMER_DATA_DIR"):
        nb.load_iwslt14()


def test_iwslt14_loader_falls_back_to_parquet_urls(nb, monkeypatch):
    """If the parquet branch will not load, the parquet files are read by URL; rows become (de, en) lines."""
    calls = []

    def load_dataset(path, revision=None, data_files=None):
        calls.append((path, revision, data_files))
        if path != "parquet":
            raise ValueError("loading scripts are no longer supported")
        return {split: {"translation": [{"de": f"{split} de", "en": f"{split} en"}]} for split in data_files}

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    monkeypatch.setattr(nb, "check_hub", lambda: None)
    corpus = nb.load_iwslt14()
    assert calls[0][:2] == ("bbaaaa/iwslt14-de-en", "refs/convert/parquet")
    assert calls[1][2]["test"].endswith("refs%2Fconvert%2Fparquet/de-en/test/0000.parquet")
    assert corpus["validation"] == (["validation de"], ["validation en"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_missing_gpu_warns_and_names_smoke(nb):
    with pytest.warns(UserWarning, match="No GPU found.*TRANSFORMER_PRESET=cpu"):
        device = nb.pick_device(nb.make_config("iwslt14"))
    assert device.type == "cpu"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nb.pick_device(nb.make_config("smoke"))  # the CPU is what smoke and cpu are for: no warning
        nb.pick_device(nb.make_config("cpu"))


@pytest.mark.parametrize("beam", [1, 2], ids=["greedy", "beam"])
def test_translate_empty_and_overlong_input(nb, monkeypatch, beam):
    """Empty input gives ''. An input longer than the positional table allows (room is kept for max_extra_len
    output tokens and <eos>) is truncated, with a warning: the decoder gets at most max_positions - max_extra_len
    - 1 source tokens, the last of them <eos>; a short input in the same call is passed whole."""
    assert nb.translate("", nb.model, nb.tokenizer, nb.cfg, torch.device("cpu")) == ""
    assert nb.translate("   ", nb.model, nb.tokenizer, nb.cfg, torch.device("cpu")) == ""
    cfg = nb.make_config("smoke", max_positions=80, max_extra_len=10, decode_max_tokens=4096)
    limit = cfg.max_positions - cfg.max_extra_len - 1
    overlong, short = "Ein Hund läuft. " * 40, "Ein Hund läuft."
    assert len(nb.tokenizer.encode(overlong).ids) > 2 * limit
    sources = []
    name = "greedy_decode" if beam == 1 else "beam_search"
    real = getattr(nb, name)

    def spy(model, src, *args, **kwargs):
        sources.append(src.clone())
        return real(model, src, *args, **kwargs)

    monkeypatch.setattr(nb, name, spy)
    with pytest.warns(UserWarning, match="1 input.* longer than 68 tokens were truncated"):
        out = nb.decode_corpus(nb.model, nb.tokenizer, [overlong, short], cfg, torch.device("cpu"), beam=beam)
    assert len(out) == 2 and all(isinstance(x, str) for x in out)
    rows = [row[row != nb.PAD].tolist() for src in sources for row in src]
    assert max(src.size(1) for src in sources) == limit
    assert sorted(rows, key=len) == [nb.tokenizer.encode(short).ids + [nb.EOS],
                                     nb.tokenizer.encode(overlong).ids[: limit - 1] + [nb.EOS]]


# ---------------------------------------------------------------- training never loses progress
def test_interrupted_and_resumed_run_equals_uninterrupted(nb, tmp_path, monkeypatch, capsys):
    """Stop after k steps (mid-epoch), resume in a fresh model: the parameters end bit-for-bit equal to an
    uninterrupted run, across an epoch boundary (shuffled order, dropout's random state, Adam's moments).
    Between the sessions the fresh model's weights and the random generators are scrambled, so only what the
    checkpoint restores can make the runs agree; and the resumed session trains only the remaining steps."""
    fingerprint = {"test": 1}
    cfg, model, train, valid = small_setup(nb, tmp_path, "straight")
    n_per_epoch = len(train)
    total, k = n_per_epoch + 3, n_per_epoch // 2
    straight = nb.train(model, train, valid, cfg, torch.device("cpu"), fingerprint, max_steps=total)

    cfg2, model2, _, _ = small_setup(nb, tmp_path, "resumed")
    first = nb.train(model2, train, valid, cfg2, torch.device("cpu"), fingerprint, max_steps=k)
    assert (first.step, first.epoch, first.batch_in_epoch) == (k, 0, k)
    _, model3, _, _ = small_setup(nb, tmp_path, "resumed")
    with torch.no_grad():  # whatever happens between sessions must not matter
        for p in model3.parameters():
            p.add_(torch.randn_like(p))
    torch.manual_seed(999)
    random.seed(999)

    steps = []
    real_train_step = nb.train_step

    def counting_train_step(*args, **kwargs):
        steps.append(inspect.signature(real_train_step).bind(*args, **kwargs).arguments["step"])
        return real_train_step(*args, **kwargs)

    monkeypatch.setattr(nb, "train_step", counting_train_step)
    capsys.readouterr()
    resumed = nb.train(model3, train, valid, cfg2, torch.device("cpu"), fingerprint, max_steps=total)
    assert f"step {k}, epoch 0, batch {k}" in capsys.readouterr().out
    assert steps == list(range(k + 1, total + 1))  # the remaining steps, numbered on from the checkpoint
    assert resumed.step == straight.step == total
    assert resumed.history["val_loss"] == straight.history["val_loss"]
    for (name, a), b in zip(model.state_dict().items(), model3.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_stop_pressed_in_the_middle_of_a_step_resumes_exactly(nb, tmp_path, monkeypatch, capsys):
    """Stop (a real SIGINT, as the notebook's interrupt sends) arriving inside step k's forward pass, after its
    dropout masks were drawn: the step finishes, training stops before the next one and saves; resumed in a fresh
    model it ends bit-for-bit equal to an uninterrupted run. Without waiting for the step's end, the checkpoint would
    hold the random state after that step's draws, and the resumed run would draw other masks."""
    fingerprint = {"test": 1}
    cfg, model, train, valid = small_setup(nb, tmp_path, "straight")
    total, k = len(train) + 2, 3
    straight = nb.train(model, train, valid, cfg, torch.device("cpu"), fingerprint, max_steps=total)

    cfg2, model2, _, _ = small_setup(nb, tmp_path, "stopped")
    calls, real_batch_loss = [], nb.batch_loss

    def press_stop_in_step_k(*args, **kwargs):
        result = real_batch_loss(*args, **kwargs)
        calls.append(1)
        if len(calls) == k:  # the forward pass of step k is done: its dropout masks are drawn
            signal.raise_signal(signal.SIGINT)
        return result

    monkeypatch.setattr(nb, "batch_loss", press_stop_in_step_k)
    capsys.readouterr()
    stopped = nb.train(model2, train, valid, cfg2, torch.device("cpu"), fingerprint, max_steps=total)
    assert stopped.step == k and "interrupted at step 3" in capsys.readouterr().out
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Stop acts as usual again
    monkeypatch.setattr(nb, "batch_loss", real_batch_loss)
    _, model3, _, _ = small_setup(nb, tmp_path, "stopped")
    torch.manual_seed(999)
    resumed = nb.train(model3, train, valid, cfg2, torch.device("cpu"), fingerprint, max_steps=total)
    assert resumed.step == straight.step == total
    for (name, a), b in zip(model.state_dict().items(), model3.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_checkpoint_of_other_settings_is_refused(nb, tmp_path):
    cfg, model, train, valid = small_setup(nb, tmp_path, "run")
    nb.train(model, train, valid, cfg, torch.device("cpu"), {"d_model": 64, "data": "a"}, max_steps=2)
    with pytest.raises(ValueError, match=r"other settings \(data differ\).*TRANSFORMER_WORK_DIR"):
        nb.train(model, train, valid, cfg, torch.device("cpu"), {"d_model": 64, "data": "b"}, max_steps=4)
    with pytest.raises(ValueError, match=r"another version of this notebook.*TRANSFORMER_WORK_DIR"):
        nb.train(model, train, valid, cfg, torch.device("cpu"), {"d_model": 64, "data": "a", "dropout": 0.1},
                 max_steps=4)


def test_fingerprint_of_adam_betas_given_as_a_list(nb):
    base = nb.make_config("smoke")
    listed = nb.make_config("smoke", adam_betas=list(base.adam_betas))
    assert nb.model_fingerprint(listed, "d") == nb.model_fingerprint(base, "d")


def test_time_budget_stops_cleanly_with_a_checkpoint(nb, tmp_path, capsys):
    cfg, model, train, valid = small_setup(nb, tmp_path, "budget", time_budget_min=1e-9)
    state = nb.train(model, train, valid, cfg, torch.device("cpu"), {})
    assert state.step <= 1 and state.epoch == 0
    assert (Path(cfg.work_dir) / "checkpoints" / "last.pt").exists()
    assert "the time budget reached" in capsys.readouterr().out


def test_every_epoch_is_kept_and_the_last_k_are_averaged(nb, tmp_path):
    """Every epoch's weights stay on disk (for the BLEU-per-epoch figure of section 11); the epoch-end average takes the
    last average_last of them, and the final-stretch average the snapshots."""
    cfg, model, train, valid = small_setup(nb, tmp_path, "avg", epochs=4, average_last=2)
    nb.train(model, train, valid, cfg, torch.device("cpu"), {})
    ckpt_dir = Path(cfg.work_dir) / "checkpoints"
    assert [p.name for p in nb.saved_weights(ckpt_dir, "epoch")] == [f"epoch{e}.pt" for e in (1, 2, 3, 4)]
    sets = nb.averaging_sets(ckpt_dir, cfg)
    assert sets["epoch-end average of 2"] == [ckpt_dir / "epoch3.pt", ckpt_dir / "epoch4.pt"]
    assert sets["final-stretch average of 2"] == nb.saved_weights(ckpt_dir, "snapshot")
    a, b = (torch.load(p, weights_only=True) for p in sets["epoch-end average of 2"])
    averaged = nb.average_checkpoints(sets["epoch-end average of 2"])
    assert torch.equal(b["embedding.weight"], model.state_dict()["embedding.weight"])
    for key in a:
        assert torch.allclose(averaged[key], (a[key].float() + b[key].float()) / 2)
    assert not torch.equal(averaged["embedding.weight"], b["embedding.weight"])


def test_an_average_of_one_file_is_not_offered(nb, tmp_path):
    cfg = nb.make_config("smoke", average_last=3)
    for name in ("epoch1.pt", "snapshot10.pt"):
        torch.save({"w": torch.zeros(1)}, tmp_path / name)
    assert nb.averaging_sets(tmp_path, cfg) == {}
    torch.save({"w": torch.zeros(1)}, tmp_path / "epoch2.pt")
    assert list(nb.averaging_sets(tmp_path, cfg)) == ["epoch-end average of 2"]


def test_final_stretch_snapshots_are_evenly_spaced_and_end_with_the_last_weights(nb, tmp_path):
    """average_last snapshots over the final average_span of the planned steps: with 3 over the last 30 %, at the
    first steps past 80 %, 90 % and 100 % of the plan; the last one is the final weights. Epoch ends are kept
    beside them."""
    cfg, model, train, valid = small_setup(nb, tmp_path, "stretch", epochs=4, average_last=3, average_span=0.3)
    nb.train(model, train, valid, cfg, torch.device("cpu"), {})
    planned = 4 * len(train)
    ckpt_dir = Path(cfg.work_dir) / "checkpoints"
    expected = [math.ceil(planned * share - 1e-9) for share in (0.8, 0.9, 1.0)]
    assert [p.name for p in nb.saved_weights(ckpt_dir, "snapshot")] == [f"snapshot{step}.pt" for step in expected]
    last = torch.load(ckpt_dir / f"snapshot{planned}.pt", weights_only=True)
    assert all(torch.equal(last[k], v) for k, v in model.state_dict().items())
    assert [p.name for p in nb.saved_weights(ckpt_dir, "epoch")] == [f"epoch{e}.pt" for e in (1, 2, 3, 4)]


class Crash(Exception):
    pass


def test_a_crash_between_the_epoch_writes_loses_no_averaging_snapshot(nb, tmp_path, monkeypatch):
    """At an epoch's end two files are written: epochN.pt and last.pt (which records the epoch as done). A crash
    between the two writes must not lose epochN.pt for good: after resuming, every epoch file is there (today's
    order writes the epoch file first, so the resumed run repeats the epoch and writes it again)."""
    cfg, model, train, valid = small_setup(nb, tmp_path, "crash", epochs=3, average_last=5,
                                           checkpoint_every_min=60.0)
    real_save = nb.save_atomically
    written = []

    def crash_on_the_second_epoch_end_write(obj, path, *args, **kwargs):
        epoch_end = path.name == "epoch1.pt" or (path.name == "last.pt" and obj["state"]["epoch"] == 1)
        if epoch_end:
            written.append(path.name)
            if len(written) == 2:
                raise Crash(f"power cut while writing {path.name}")
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(nb, "save_atomically", crash_on_the_second_epoch_end_write)
    with pytest.raises(Crash):
        nb.train(model, train, valid, cfg, torch.device("cpu"), {})
    monkeypatch.setattr(nb, "save_atomically", real_save)
    _, model2, _, _ = small_setup(nb, tmp_path, "crash", epochs=3, average_last=5, checkpoint_every_min=60.0)
    state = nb.train(model2, train, valid, cfg, torch.device("cpu"), {})
    assert state.epoch == 3
    ckpt_dir = Path(cfg.work_dir) / "checkpoints"
    assert [p.name for p in nb.saved_weights(ckpt_dir, "epoch")] == ["epoch1.pt", "epoch2.pt", "epoch3.pt"]


def test_checkpoint_write_is_atomic(nb, tmp_path, monkeypatch):
    """A crash while writing leaves the previous checkpoint intact."""
    path = tmp_path / "last.pt"
    nb.save_atomically({"step": 1}, path)

    def crash(obj, f):
        Path(f).write_bytes(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(nb.torch, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        nb.save_atomically({"step": 2}, path)
    monkeypatch.undo()
    assert torch.load(path) == {"step": 1}


def test_non_finite_loss_skips_the_step(nb, tmp_path):
    """A NaN loss leaves weights and Adam's state untouched; the next finite step updates them."""
    cfg, model, train, _ = small_setup(nb, tmp_path, "nan")
    optimizer = nb.make_optimizer(model, cfg)
    amp_dtype, scaler = nb.amp_settings(torch.device("cpu"), False)
    before = {k: v.clone() for k, v in model.state_dict().items()}

    def poisoned(src, tgt_in, real=None):
        return model(src, tgt_in, real) * float("nan")

    assert not torch.isfinite(nb.train_step(poisoned, train[0], optimizer, scaler, amp_dtype, cfg, 1))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(float(s["step"]) == 0 for s in optimizer.state.values())
    assert torch.isfinite(nb.train_step(model, train[0], optimizer, scaler, amp_dtype, cfg, 1))
    assert not all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_training_reports_skipped_steps(nb, tmp_path, capsys):
    cfg, model, train, valid = small_setup(nb, tmp_path, "nan-run")
    calls = []

    def poison_third_training_call(module, inputs, output):
        calls.append(module.training)
        return output * float("nan") if module.training and calls.count(True) == 3 else output

    model.register_forward_hook(poison_third_training_call)
    state = nb.train(model, train, valid, cfg, torch.device("cpu"), {}, max_steps=6)
    assert state.skipped_steps == 1
    assert re.search(r"\b1 step\(s\) .*skipped", capsys.readouterr().out)
    assert nb.weights_are_finite(model) and all(map(math.isfinite, state.history["train_loss"]))


def test_overflowing_gradients_of_a_finite_loss_are_counted_as_skipped(nb, tmp_path, capsys, monkeypatch):
    """With fp16 the scaler also skips steps whose loss is finite but whose gradients overflowed: the count comes
    from Adam's own step counter, so those are reported too, and the weights are left as they were."""
    cfg, model, train, valid = small_setup(nb, tmp_path, "overflow-run")
    backward_calls, losses = [], []
    weight = model.embedding.weight

    def overflow_on_the_fourth_backward(grad):
        backward_calls.append(1)
        return grad * float("inf") if len(backward_calls) == 4 else grad

    weight.register_hook(overflow_on_the_fourth_backward)
    step = nb.train_step

    def recording_step(*args, **kwargs):
        before = weight.detach().clone()
        losses.append(step(*args, **kwargs))
        if len(losses) == 4:
            assert torch.equal(weight, before), "the overflowing step changed the weights"
        return losses[-1]

    with monkeypatch.context() as patch:
        patch.setattr(nb, "train_step", recording_step)
        state = nb.train(model, train, valid, cfg, torch.device("cpu"), {}, max_steps=7)
    assert len(backward_calls) == 7 and all(torch.isfinite(loss) for loss in losses)  # every loss was finite
    assert state.skipped_steps == 1
    assert re.search(r"\b1 step\(s\) .*skipped", capsys.readouterr().out)
    assert nb.weights_are_finite(model)


def test_non_finite_weights_are_never_checkpointed(nb, tmp_path):
    cfg, model, _, _ = small_setup(nb, tmp_path, "nanw")
    optimizer = nb.make_optimizer(model, cfg)
    _, scaler = nb.amp_settings(torch.device("cpu"), False)
    with torch.no_grad():
        model.embedding.weight[5, 0] = float("inf")
    path = tmp_path / "ck.pt"
    with pytest.warns(UserWarning, match="non-finite weights"):
        assert not nb.save_checkpoint(path, model, optimizer, scaler, nb.TrainState(), {})
    assert not path.exists()


def test_non_finite_weights_are_not_kept_for_averaging(nb, tmp_path):
    """keep_weights skips (with a warning) an epoch whose weights are not finite, and does not let it push
    a good older epoch out of the kept set either."""
    _, model, _, _ = small_setup(nb, tmp_path, "nan-epoch")
    ckpt_dir = tmp_path / "ckpt"
    for epoch in (1, 2):
        nb.keep_weights(model, ckpt_dir, "epoch", epoch, keep=2)
    with torch.no_grad():
        model.decoder[0].feed_forward.linear1.weight[0, 0] = float("nan")
    with pytest.warns(UserWarning, match="not writing epoch 3 weights: they are not finite"):
        nb.keep_weights(model, ckpt_dir, "epoch", 3, keep=2)
    assert [p.name for p in nb.saved_weights(ckpt_dir, "epoch")] == ["epoch1.pt", "epoch2.pt"]
    assert not list(ckpt_dir.glob("*.tmp"))
    with torch.no_grad():
        model.decoder[0].feed_forward.linear1.weight[0, 0] = 0.0
    nb.keep_weights(model, ckpt_dir, "epoch", 4, keep=2)
    assert [p.name for p in nb.saved_weights(ckpt_dir, "epoch")] == ["epoch2.pt", "epoch4.pt"]


# settings that shape the model, its batches or its training: a checkpoint of one cannot be resumed by another
SHAPE_CHANGES = {"d_model": {"d_model": 32}, "n_heads": {"n_heads": 2}, "d_ff": {"d_ff": 128},
                 "encoder_layers": {"encoder_layers": 3}, "decoder_layers": {"decoder_layers": 1},
                 "vocab_size": {"vocab_size": 999}, "max_len": {"max_len": 50}, "max_tokens": {"max_tokens": 1024},
                 "seed": {"seed": 7}, "src_lang": {"src_lang": "en", "tgt_lang": "de"},
                 # training settings: a run resumed under other ones would be neither the old run nor the new
                 "dropout": {"dropout": 0.3}, "attention_dropout": {"attention_dropout": 0.1},
                 "label_smoothing": {"label_smoothing": 0.0},
                 "warmup_steps": {"warmup_steps": 100}, "lr_factor": {"lr_factor": 0.5},
                 "adam_betas": {"adam_betas": (0.9, 0.999)}, "adam_eps": {"adam_eps": 1e-8}}


@pytest.mark.parametrize("changed", list(SHAPE_CHANGES))
def test_model_fingerprint_changes_with_every_shaping_setting(nb, changed):
    base = nb.make_config("smoke")
    other = nb.make_config("smoke", **SHAPE_CHANGES[changed])
    a, b = nb.model_fingerprint(base, "data1"), nb.model_fingerprint(other, "data1")
    assert a != b and a[changed] != b[changed]
    assert nb.model_fingerprint(base, "data1") == a  # deterministic
    assert nb.model_fingerprint(base, "data2") != a  # other data


def test_model_fingerprint_ignores_settings_that_may_change_on_resume(nb):
    """Training longer (epochs, time budget), logging, decoding and evaluation settings may change between sessions."""
    base = nb.make_config("smoke")
    other = nb.make_config("smoke", epochs=20, time_budget_min=99.0, checkpoint_every_min=2.0, log_every=5,
                           beam_size=2, length_penalty=1.0, max_extra_len=20, decode_max_tokens=999,
                           average_last=2, max_eval_sentences=50, work_dir="elsewhere")
    assert nb.model_fingerprint(base, "d") == nb.model_fingerprint(other, "d")


@pytest.mark.parametrize("changed", ["d_model", "vocab_size", "decoder_layers"])
def test_checkpoint_of_another_model_shape_is_refused(nb, tmp_path, changed):
    """load_checkpoint refuses, naming the setting, a checkpoint written for another model shape, before it
    touches the model; the same shape resumes exactly."""
    cfg_a = nb.make_config("smoke", work_dir=str(tmp_path))
    cfg_b = nb.make_config("smoke", work_dir=str(tmp_path), **SHAPE_CHANGES[changed])
    _, scaler = nb.amp_settings(torch.device("cpu"), False)
    torch.manual_seed(0)
    model_a = nb.build_model(cfg_a, cfg_a.vocab_size)
    path = tmp_path / "last.pt"
    assert nb.save_checkpoint(path, model_a, nb.make_optimizer(model_a, cfg_a), scaler,
                              nb.TrainState(step=3), nb.model_fingerprint(cfg_a, "data"))

    model_b = nb.build_model(cfg_b, cfg_b.vocab_size)
    before = {k: v.clone() for k, v in model_b.state_dict().items()}
    with pytest.raises(ValueError, match=rf"other settings \({changed} differ\)"):
        nb.load_checkpoint(path, model_b, nb.make_optimizer(model_b, cfg_b), scaler,
                           nb.model_fingerprint(cfg_b, "data"))
    assert all(torch.equal(before[k], v) for k, v in model_b.state_dict().items())

    torch.manual_seed(1)
    same = nb.build_model(cfg_a, cfg_a.vocab_size)
    state = nb.load_checkpoint(path, same, nb.make_optimizer(same, cfg_a), scaler, nb.model_fingerprint(cfg_a, "data"))
    assert state.step == 3
    assert all(torch.equal(a, b) for a, b in zip(model_a.state_dict().values(), same.state_dict().values(), strict=True))


def test_decoding_chunks_are_bounded_and_order_is_kept(nb, monkeypatch):
    """decode_corpus never hands the decoder more than decode_max_tokens (sentences x beams x length)."""
    cfg = nb.make_config("smoke", decode_max_tokens=600, max_extra_len=10)
    texts = nb.corpus["test"][0][:40]
    seen = []
    real = nb.beam_search

    def spy(model, src, beam, *args, **kwargs):
        seen.append(src.size(0) * beam * (src.size(1) + cfg.max_extra_len))
        return real(model, src, beam, *args, **kwargs)

    monkeypatch.setattr(nb, "beam_search", spy)
    chunked = nb.decode_corpus(nb.model, nb.tokenizer, texts, cfg, torch.device("cpu"), beam=2)
    assert len(seen) > 1 and max(seen) <= cfg.decode_max_tokens
    one_by_one = [nb.decode_corpus(nb.model, nb.tokenizer, [t], cfg, torch.device("cpu"), beam=2)[0] for t in texts[:8]]
    assert chunked[:8] == one_by_one


# ---------------------------------------------------------------- which BLEU, and the Multi30k download
def test_text_style_names_the_kind_of_bleu(nb):
    iwslt_like = ["it 's a great idea , and we 'll see .", "i do n't know what &apos;s going on ."] * 50
    assert nb.text_style(iwslt_like) == "lowercased, tokenized"
    assert nb.text_style(nb.corpus["test"][1]) == "cased, detokenized"
    assert nb.text_style([line.lower() for line in nb.corpus["test"][1]]) == "lowercased, detokenized"


def test_multi30k_download_writes_the_six_files_once(nb, tmp_path, monkeypatch):
    import gzip
    import io

    fetched = []

    def fake_urlopen(url, timeout):
        fetched.append(url)
        lang = url.split(".")[-2]
        return io.BytesIO(gzip.compress(f"{lang} one\n{lang} two\n".encode()))

    monkeypatch.setattr(nb.urllib.request, "urlopen", fake_urlopen)
    monkeypatch.setattr(nb, "MULTI30K_LINES", {"train": 2, "validation": 2, "test": 2})  # the fake files' length
    folder = nb.download_multi30k(tmp_path / "m30k")
    assert len(fetched) == 6 and any("test_2016_flickr.de.gz" in url for url in fetched)
    assert nb.read_parallel_folder(folder)["validation"] == (["de one", "de two"], ["en one", "en two"])
    nb.download_multi30k(tmp_path / "m30k")
    assert len(fetched) == 6  # already there: nothing fetched again


def test_multi30k_download_failure_explains_offline_use(nb, tmp_path, monkeypatch):
    def offline(url, timeout):
        raise OSError("Temporary failure in name resolution")

    monkeypatch.setattr(nb.urllib.request, "urlopen", offline)
    with pytest.raises(ConnectionError, match="could not download .*TRANSFORMER_DATA_DIR"):
        nb.download_multi30k(tmp_path / "m30k")


# ---------------------------------------------------------------- re-running cells, as a student does
def test_cells_after_training_name_the_cell_to_run(nb):
    """Training skipped (the fixture runs no slow cell): what a later cell needs is missing, and made() says which
    cell makes it, instead of a NameError or an answer from the untrained model."""
    for name, cell in (("trained_model", "section 8's training cell"), ("state", "section 8's training cell"),
                       ("last_weights", "section 8's training cell"), ("evaluation", "section 11's evaluation cell")):
        with pytest.raises(RuntimeError, match=f"needs `{name}`: run {cell} first"):
            nb.made(name)


def test_attention_maps_survive_a_redefined_attention_class(nb, monkeypatch):
    """The attention cell re-run after training defines a new MultiHeadAttention class, of which the trained layers
    are not instances: keep_attention_weights still finds them (by what they do, not by their class)."""
    model = nb.build_model(nb.cfg, nb.VOCAB).eval()
    monkeypatch.setattr(nb, "MultiHeadAttention", type("MultiHeadAttention", (torch.nn.Module,), {}))
    batch = nb.valid_batches[0]
    with nb.keep_attention_weights(model), torch.no_grad():
        model(batch.src[:1], batch.tgt_in[:1])
        kept = [layer.cross_attn.weights for layer in model.decoder]
    assert all(w is not None and w.shape[0] == 1 for w in kept)
    assert not any(getattr(m, "explicit", False) for m in model.modules())
