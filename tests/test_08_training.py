"""Section 8, training: the autocast dtype, the training step (also on the GPU's path under autocast), files written
whole, the fingerprint a checkpoint must match, the lock on the work folder, resuming (a damaged last.pt, a checkpoint
from a two-GPU machine, bit-exact continuation), skipped steps, the weights kept for averaging, divergence, Stop and
the time budget, and the cells after training."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import errno
import fcntl
import inspect
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import warnings
import zipfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers import (
    CPU,
    LOW_PRECISION,
    PRE_NORM,
    ROOT,
    SLICE,
    STEPS,
    saved_step,
    small_setup,
    tiny_setup,
    tiny_weights,
    train_tiny,
    truncate_to_half,
)


def finite(model) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


def last_pt(nb, cfg, fingerprint: dict) -> Path:
    """The checkpoint of the run with these settings and fingerprint, wherever run_folder puts it."""
    return nb.run_folder(cfg, fingerprint) / "checkpoints" / "last.pt"


def plant_checkpoint(nb, cfg, written_by: dict, found_by: dict) -> None:
    """The checkpoint of the run `written_by`, put where the run `found_by` looks for its own (as a folder shared by
    hand, or a run folder named without some setting, would have it): what load_checkpoint must refuse."""
    source, target = last_pt(nb, cfg, written_by), last_pt(nb, cfg, found_by)
    if source != target:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, target)


# ---------------------------------------------------------------- mixed precision (autocast_dtype)
@pytest.mark.parametrize("capability, expected", [((7, 5), torch.float16), ((8, 0), torch.bfloat16),
                                                   ((9, 0), torch.bfloat16), ((6, 0), torch.float16)])
def test_autocast_dtype_is_fp16_on_a_t4_and_bf16_from_ampere_on(nb, monkeypatch, capability, expected):
    """A T4 (compute capability 7.5) emulates bf16 slowly, although torch.cuda.is_bf16_supported() says True there."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert nb.autocast_dtype(torch.device("cuda")) is expected
    assert nb.autocast_dtype(torch.device("cuda"), enabled=False) is None
    assert nb.autocast_dtype(CPU) is None


# ---------------------------------------------------------------- the training step (train_step)
@pytest.mark.parametrize("step", [1, 7, 200, 1234])
def test_train_step_uses_the_lr_of_its_step(nb, step):
    cfg = nb.make_config("smoke", dropout=0.0, lr_factor=2.0)  # d_model 64, warmup 200; a factor that must count
    torch.manual_seed(0)
    model = nb.build_model(cfg, nb.VOCAB)
    optimizer = nb.make_optimizer(model, cfg)
    amp_dtype, scaler = nb.autocast_dtype(CPU, cfg.amp), torch.amp.GradScaler("cpu")
    assert amp_dtype is None
    b = nb.train_batches[0]
    batch = nb.Batch(b.src[:4], b.tgt_in[:4], b.tgt_out[:4], int((b.tgt_out[:4] != nb.PAD).sum()))
    before = [p.detach().clone() for p in model.parameters()]
    model.train()
    loss = nb.train_step(model, batch, optimizer, scaler, amp_dtype, cfg, step)
    expected = nb.transformer_lr(step, cfg.d_model, cfg.warmup_steps, cfg.lr_factor)
    assert loss is not None and torch.isfinite(loss)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(expected, rel=1e-12)
    # Adam's first update moves each parameter by lr * g / (|g| + eps): exactly lr where the gradient is not tiny.
    # So the step really used this learning rate (set before optimizer.step, not after).
    largest = max((p.detach() - q).abs().max().item() for p, q in zip(model.parameters(), before))
    assert largest == pytest.approx(expected, rel=1e-3)


def test_train_step_equals_a_reference_adam_step(nb):
    """Three train_steps equal three hand-written ones: lr of the step, label-smoothed cross entropy over non-PAD
    targets per token, Adam(0.9, 0.98, 1e-9), fresh gradients each step."""
    import copy

    cfg = nb.make_config("smoke", dropout=0.0, lr_factor=2.0)
    with torch.random.fork_rng():
        torch.manual_seed(1)
        model = nb.build_model(cfg, nb.VOCAB)
    reference = copy.deepcopy(model)
    optimizer = nb.make_optimizer(model, cfg)
    amp_dtype, scaler = nb.autocast_dtype(CPU, cfg.amp), torch.amp.GradScaler("cpu")
    ref_optimizer = torch.optim.Adam(reference.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    batches = []
    for b in nb.train_batches[:2]:
        n = int((b.tgt_out[:6] != nb.PAD).sum())
        batches.append(nb.Batch(b.src[:6], b.tgt_in[:6], b.tgt_out[:6], n))
    model.train()
    reference.train()
    for step, batch in zip((50, 51, 52), (batches[0], batches[1], batches[0])):
        nb.train_step(model, batch, optimizer, scaler, amp_dtype, cfg, step)
        for group in ref_optimizer.param_groups:
            group["lr"] = cfg.lr_factor * cfg.d_model ** -0.5 * min(step ** -0.5, step * cfg.warmup_steps ** -1.5)
        logits = reference(batch.src, batch.tgt_in)
        loss = F.cross_entropy(logits.flatten(0, 1), batch.tgt_out.flatten(), ignore_index=nb.PAD,
                               label_smoothing=cfg.label_smoothing, reduction="sum") / batch.n_tokens
        loss.backward()
        ref_optimizer.step()
        ref_optimizer.zero_grad(set_to_none=True)
    d = cfg.d_model
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        if name.endswith("in_proj.bias"):  # the key bias cannot change attention: its gradient is rounding noise,
            p, q = torch.cat([p[:d], p[2 * d:]]), torch.cat([q[:d], q[2 * d:]])  # which Adam blows up to +-lr
        assert torch.allclose(p, q, rtol=1e-4, atol=1e-5), f"{name} differs by {(p - q).abs().max().item():.2e}"
    assert all(p.grad is None or not p.grad.any() for p in model.parameters()), "gradients left behind"


# The largest gap between an autocast step's loss per token and the fp32 step's, same weights and dropout masks.
# Measured (torch 2.13 CPU): fp16 0.013, bf16 0.007 nats over the 6 steps; the bound leaves a margin of about 4x.
LOSS_TOLERANCE = 0.05


@pytest.mark.parametrize("name", LOW_PRECISION)
def test_gpu_training_step_under_autocast_with_scaler_and_fused_adam(nb, tmp_path, fp32_run, name):
    """The padded step under fp16 / bf16 autocast, scaled, with fused Adam: finite, the loss falling, every step within
    LOSS_TOLERANCE of the fp32 step, and no step skipped (the initial scale, 2^16, does not overflow here)."""
    run = train_tiny(nb, tmp_path, LOW_PRECISION[name])
    assert set(run["seen"]) == {LOW_PRECISION[name]}
    assert run["optimizer"].defaults["fused"] and run["scaler"].is_enabled()
    losses, reference = run["losses"], fp32_run["losses"]
    assert all(map(math.isfinite, losses)) and finite(run["model"])
    assert losses[-1] < losses[0] - 1.0, f"the {name} loss did not fall: {losses}"
    assert reference[-1] < reference[0] - 1.0, f"the fp32 loss did not fall: {reference}"
    gap = max(abs(a - b) for a, b in zip(losses, reference, strict=True))
    assert gap < LOSS_TOLERANCE, f"{name} vs fp32, loss per token: {losses} vs {reference}"
    adam_steps = {int(s["step"]) for s in run["optimizer"].state.values()}
    assert adam_steps == {STEPS} and run["scaler"].get_scale() == 2.0**16  # every step applied, no overflow


def test_non_finite_loss_skips_the_step(nb, tmp_path):
    """A NaN loss leaves weights and Adam's state untouched; the next finite step updates them."""
    cfg, model, train, _ = small_setup(nb, tmp_path, "nan")
    optimizer = nb.make_optimizer(model, cfg)
    amp_dtype, scaler = None, torch.amp.GradScaler("cpu")
    before = {k: v.clone() for k, v in model.state_dict().items()}

    def poisoned(src, tgt_in):
        return model(src, tgt_in) * float("nan")

    assert not torch.isfinite(nb.train_step(poisoned, train[0], optimizer, scaler, amp_dtype, cfg, 1))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(float(s["step"]) == 0 for s in optimizer.state.values())
    assert torch.isfinite(nb.train_step(model, train[0], optimizer, scaler, amp_dtype, cfg, 1))
    assert not all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_non_finite_gradient_on_the_gpu_path_is_skipped(nb, tmp_path):
    """fp16 autocast, scaler, fused Adam, a batch padded as for a GPU: a step whose gradients overflow (its loss is
    finite) leaves the weights and Adam's state untouched and halves the scale; the next step updates again. (That
    train() counts and reports such steps: test_overflowing_gradients_of_a_finite_loss_are_counted_as_skipped.)"""
    cfg, model, batch = tiny_setup(nb, tmp_path, gpu=True)
    optimizer, scaler = nb.make_optimizer(model, cfg), torch.amp.GradScaler("cpu")
    backward_calls = []

    def overflow_on_the_third_backward(grad):
        backward_calls.append(1)
        return grad * float("inf") if len(backward_calls) == 3 else grad

    model.embedding.weight.register_hook(overflow_on_the_third_backward)

    def step():
        return nb.train_step(model, batch, optimizer, scaler, torch.float16, cfg, len(backward_calls) + 1)

    step(), step()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    adam = {id(p): {k: v.clone() for k, v in s.items()} for p, s in optimizer.state.items()}
    scale = scaler.get_scale()
    assert torch.isfinite(step())  # the loss is finite: only the gradients overflowed
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items()), "the skipped step moved weights"
    for p, s in optimizer.state.items():
        assert all(torch.equal(adam[id(p)][k], v) for k, v in s.items()), "the skipped step changed Adam's state"
    assert scaler.get_scale() == scale / 2
    step()
    assert not all(torch.equal(weights[k], v) for k, v in model.state_dict().items())


# ---------------------------------------------------------------- files written whole (save_atomically, write_json)
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


def test_full_disk_keeps_the_old_file_and_removes_the_partial_one(nb, tmp_path, monkeypatch):
    """A full disk while a checkpoint is written: an OSError says the disk is full and the old file is intact,
    naming it; no .tmp file is left behind and the old file is byte-identical."""
    path = tmp_path / "ckpt" / "last.pt"
    path.parent.mkdir()
    torch.save({"step": 1}, path)
    before = path.read_bytes()

    def failing_save(obj, f, *args, **kwargs):
        if hasattr(f, "write"):
            f.write(b"PK\x03\x04half")
        else:
            Path(f).write_bytes(b"PK\x03\x04half")
        raise RuntimeError("basic_ios::clear: iostream error")

    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(nb.torch, "save", failing_save)
    monkeypatch.setattr(shutil, "disk_usage", lambda *args, **kwargs: usage(10**9, 10**9, 0))
    with pytest.raises(OSError) as info:
        nb.save_atomically({"step": 2}, path)
    message = str(info.value)
    assert "disk is full" in message and "intact" in message and str(path) in message, message
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir()) == ["last.pt"]


def test_two_writers_of_one_file_never_clobber_each_other(nb, tmp_path, monkeypatch):
    """Two writers of last.pt at once (even without training: a second tab's evaluation) each write their own
    temporary file, named with the process id and a random part: both finish, and last.pt is one of the two, whole."""
    path = tmp_path / "last.pt"
    both_written, real_save, errors = threading.Barrier(2, timeout=30), torch.save, []

    def save_then_wait(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)
        both_written.wait()  # both temporary files are written before either is renamed

    monkeypatch.setattr(nb.torch, "save", save_then_wait)

    def writer(value):
        try:
            nb.save_atomically(tiny_weights(value), path)
        except Exception as error:  # noqa: BLE001 - collected for the assertion below
            errors.append(error)

    threads = [threading.Thread(target=writer, args=(v,)) for v in (1.0, 2.0)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    monkeypatch.undo()
    assert errors == []
    assert torch.load(path)["w"].tolist() in ([1.0, 1.0], [2.0, 2.0])
    assert not list(tmp_path.glob("*.tmp"))
    names = []  # the temporary files' names: one for each call, each naming this process
    for _ in range(50):
        nb.write_atomically(path, lambda tmp: names.append(tmp.name) or tmp.write_text("x"))
    assert len(set(names)) == 50 and all(str(nb.os.getpid()) in name for name in names)


def test_results_and_history_are_written_through_a_rename(nb, tmp_path, monkeypatch):
    """write_json (results.json, history.json) writes a temporary file and renames it: a failed write leaves the old
    file whole and no temporary file behind."""
    path = tmp_path / "results.json"
    nb.write_json({"bleu": 1.0}, path, indent=1)
    assert json.loads(path.read_text()) == {"bleu": 1.0}

    def fail_halfway(self, text, *args, **kwargs):
        with open(self, "w") as file:
            file.write(text[: len(text) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(nb.Path, "write_text", fail_halfway)
    with pytest.raises(OSError, match="No space"):
        nb.write_json({"bleu": 2.0}, path)
    monkeypatch.undo()
    assert json.loads(path.read_text()) == {"bleu": 1.0}
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]


# ---------------------------------------------------------------- what a checkpoint must match (model_fingerprint)
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


def test_fingerprint_of_adam_betas_given_as_a_list(nb):
    base = nb.make_config("smoke")
    listed = nb.make_config("smoke", adam_betas=list(base.adam_betas))
    assert nb.model_fingerprint(listed, "d") == nb.model_fingerprint(base, "d")


@pytest.mark.parametrize("changed", ["d_model", "vocab_size", "decoder_layers"])
def test_checkpoint_of_another_model_shape_is_refused(nb, tmp_path, changed):
    """load_checkpoint refuses, naming the setting, a checkpoint written for another model shape, before it
    touches the model; the same shape resumes exactly."""
    cfg_a = nb.make_config("smoke", work_dir=str(tmp_path))
    cfg_b = nb.make_config("smoke", work_dir=str(tmp_path), **SHAPE_CHANGES[changed])
    scaler = torch.amp.GradScaler("cpu")
    torch.manual_seed(0)
    model_a = nb.build_model(cfg_a, cfg_a.vocab_size)
    path = tmp_path / "checkpoints" / "last.pt"
    nb.save_checkpoint(path, model_a, nb.make_optimizer(model_a, cfg_a), scaler, nb.TrainState(step=3),
                       nb.model_fingerprint(cfg_a, "data"))

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


def test_checkpoint_of_other_settings_is_refused(nb, tmp_path):
    cfg, model, train, valid = small_setup(nb, tmp_path, "run")
    nb.train(model, train, valid, cfg, torch.device("cpu"), {"d_model": 64, "data": "a"}, max_steps=2)
    plant_checkpoint(nb, cfg, {"d_model": 64, "data": "a"}, {"d_model": 64, "data": "b"})
    with pytest.raises(ValueError, match=r"other settings \(data differ\).*`cfg\.work_dir = \"\"`"):
        nb.train(model, train, valid, cfg, torch.device("cpu"), {"d_model": 64, "data": "b"}, max_steps=4)
    plant_checkpoint(nb, cfg, {"d_model": 64, "data": "a"}, {"d_model": 64, "data": "a", "dropout": 0.1})
    with pytest.raises(ValueError, match=r"another version of this notebook.*`cfg\.work_dir = \"\"`"):
        nb.train(model, train, valid, cfg, torch.device("cpu"), {"d_model": 64, "data": "a", "dropout": 0.1},
                 max_steps=4)


@pytest.mark.parametrize("change", ["no fingerprint", "a renamed TrainState field"])
def test_a_checkpoint_of_another_version_is_refused_not_called_damaged(nb, tmp_path, change):
    """A checkpoint that reads fine but lacks an expected key, or whose TrainState has other fields, comes from another
    version of this notebook: refused with the advice, neither called damaged nor a raw TypeError."""
    cfg, model, train, valid = small_setup(nb, tmp_path, "old")
    nb.train(model, train, valid, cfg, CPU, {"test": 1}, max_steps=1)
    last = last_pt(nb, cfg, {"test": 1})
    ckpt = torch.load(last, weights_only=False)
    if change == "no fingerprint":
        del ckpt["fingerprint"]
    else:
        ckpt["state"]["skipped"] = ckpt["state"].pop("skipped_steps")
    torch.save(ckpt, last)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "damaged" warning either
        with pytest.raises(ValueError, match=r"another version of this notebook.*`cfg\.work_dir = \"\"`"):
            nb.train(model, train, valid, cfg, CPU, {"test": 1}, max_steps=2)


@pytest.mark.parametrize("progress", [True, False])
def test_the_progress_bar_follows_cfg_progress(nb, tmp_path, monkeypatch, progress):
    """train() draws its progress bar only when cfg.progress is set (TRANSFORMER_PROGRESS=0 clears it)."""
    bars, real_tqdm = [], nb.tqdm

    def recording_tqdm(*args, **kwargs):
        bars.append(kwargs.get("disable", False))
        return real_tqdm(*args, **kwargs)

    monkeypatch.setattr(nb, "tqdm", recording_tqdm)
    cfg, model, train, valid = small_setup(nb, tmp_path, f"bar-{progress}", checkpoint_every_min=60.0, progress=progress)
    nb.train(model, train, valid, cfg, CPU, {}, max_steps=1)
    assert bars == [not progress]


# ---------------------------------------------------------------- the lock on the work folder (work_folder_lock)
def test_second_run_on_a_locked_folder_refuses_and_names_the_other(nb, tmp_path, monkeypatch):
    """Two runs on one work folder of one machine (two Colab tabs, two kernels): the first holds a lock while it
    trains; the second refuses with an error naming the folder and the run that holds it (host, process). The lock
    goes when the first run ends."""
    cfg, model, train, valid = small_setup(nb, tmp_path, "shared", checkpoint_every_min=60.0, epochs=1)
    started, go_on, real_step = threading.Event(), threading.Event(), nb.train_step
    first_run = threading.Thread(target=nb.train, args=(model, train, valid, cfg, CPU, {}), kwargs={"max_steps": 2})

    def pausing_step(*args, **kwargs):
        if threading.current_thread() is first_run:  # the first run waits, mid-training, until the second has tried
            started.set()
            go_on.wait(60)
        return real_step(*args, **kwargs)

    monkeypatch.setattr(nb, "train_step", pausing_step)
    first_run.start()
    try:
        assert started.wait(60)
        _, model2, _, _ = small_setup(nb, tmp_path, "shared", checkpoint_every_min=60.0, epochs=1)
        with pytest.raises(RuntimeError) as info:
            nb.train(model2, train, valid, cfg, CPU, {}, max_steps=2)
    finally:
        go_on.set()
        first_run.join(60)
    message = str(info.value)
    assert str(nb.run_folder(cfg, {}).resolve()) in message, message
    assert socket.gethostname() in message and re.search(r"process \d+", message), message
    assert lock_is_free(nb.run_folder(cfg, {}))
    assert nb.train(model2, train, valid, cfg, CPU, {}, max_steps=3).step == 3  # free again


def lock_is_free(folder: Path) -> bool:
    """Whether a run could take the lock on `folder` now (its .lock file is not held by any process)."""
    with open(folder / ".lock", "a+") as file:
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(file, fcntl.LOCK_UN)
        return True


def test_the_lock_of_a_live_process_is_refused_and_a_killed_ones_is_gone(nb, tmp_path):
    """A run holding the folder in another process (another kernel) makes training refuse, naming that process; once
    it is killed (no chance to clean up), training goes on, without a warning, whatever the .lock file still says."""
    cfg, model, train, valid = small_setup(nb, tmp_path, "other", checkpoint_every_min=60.0)
    folder = nb.run_folder(cfg, {})
    folder.mkdir(parents=True)
    hold = ("import fcntl, sys, time; f = open(sys.argv[1], 'a+'); fcntl.flock(f, fcntl.LOCK_EX); "
            "f.write('process 4242 on another-tab'); f.flush(); print('held', flush=True); time.sleep(600)")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(folder / ".lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RuntimeError, match=r"in use by another training run \(process 4242 on another-tab\)"):
            nb.train(model, train, valid, cfg, CPU, {}, max_steps=2)
    finally:
        holder.kill()
        holder.wait()
    assert (folder / ".lock").read_text() == "process 4242 on another-tab"  # left behind by the killed process
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert nb.train(model, train, valid, cfg, CPU, {}, max_steps=2).step == 2
    assert lock_is_free(folder)


def test_a_folder_that_cannot_be_locked_trains_with_a_warning(nb, tmp_path, monkeypatch):
    """A file system without locks (flock fails with ENOLCK, as on some network and FUSE mounts): a warning that the
    folder is not guarded, and training goes on."""
    def no_locks(file, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(nb.fcntl, "flock", no_locks)
    cfg, model, train, valid = small_setup(nb, tmp_path, "nolocks", checkpoint_every_min=60.0)
    with pytest.warns(UserWarning, match="cannot be locked .*No locks available.*no other run trains there"):
        assert nb.train(model, train, valid, cfg, CPU, {}, max_steps=2).step == 2


@pytest.mark.parametrize("ending", ["stop", "error"])
def test_lock_is_released_on_stop_and_on_errors(nb, tmp_path, monkeypatch, ending):
    """Stop (KeyboardInterrupt) and an error inside training both release the lock, so re-running the cell in the
    same kernel trains on."""
    cfg, model, train, valid = small_setup(nb, tmp_path, ending, checkpoint_every_min=60.0)
    calls, real_step = [], nb.train_step

    def failing_step(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt if ending == "stop" else RuntimeError("CUDA error: an illegal memory access")
        return real_step(*args, **kwargs)

    monkeypatch.setattr(nb, "train_step", failing_step)
    if ending == "stop":
        nb.train(model, train, valid, cfg, CPU, {}, max_steps=5)
    else:
        with pytest.raises(RuntimeError, match="illegal memory access"):
            nb.train(model, train, valid, cfg, CPU, {}, max_steps=5)
    assert lock_is_free(nb.run_folder(cfg, {}))
    monkeypatch.setattr(nb, "train_step", real_step)
    assert nb.train(model, train, valid, cfg, CPU, {}, max_steps=5).step == 5


# ---------------------------------------------------------------- resuming (load_checkpoint)
def test_damaged_checkpoint_says_to_delete_it(nb, tmp_path):
    """A last.pt cut short (a sync conflict, a broken disk: a crash or a full disk leave the old file whole): one
    RuntimeError, no warning before it, names last.pt and says to delete it to start afresh or to use another folder."""
    cfg, model, train, valid = small_setup(nb, tmp_path, "damaged", checkpoint_every_min=60.0)
    nb.train(model, train, valid, cfg, CPU, {"test": 1}, max_steps=3)
    last = last_pt(nb, cfg, {"test": 1})
    truncate_to_half(last)
    _, model, _, _ = small_setup(nb, tmp_path, "damaged", checkpoint_every_min=60.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the error alone: no "left out" warning before it
        with pytest.raises(RuntimeError) as info:
            nb.train(model, train, valid, cfg, CPU, {"test": 1}, max_steps=7)
    message = str(info.value)
    assert f"{last} is damaged" in message and "delete it to start afresh" in message, message
    assert "another folder" in message and "`cfg.work_dir" in message, message
    assert lock_is_free(nb.run_folder(cfg, {"test": 1}))


@contextlib.contextmanager
def storages_tagged(location: str):
    """Inside the block torch.save records every storage as living on `location` (e.g. "cuda:0"), as it does for
    CUDA tensors: a file like one written on a GPU, without a GPU."""
    tagger = lambda storage: location
    torch.serialization.register_package(-100, tagger, lambda storage, loc: None)
    try:
        yield
    finally:
        torch.serialization._package_registry[:] = [e for e in torch.serialization._package_registry
                                                    if e[1] is not tagger]


class FakeCudaGenerator:
    def __init__(self):
        self.states = []

    def set_state(self, state):
        self.states.append(state.clone())


@contextlib.contextmanager
def cuda_machine(monkeypatch, devices: int):
    """torch.cuda as on a machine with `devices` GPUs, as far as the random generators go: torch's own
    set_rng_state runs, against `devices` generators (set_rng_state_all of a longer list raises IndexError)."""
    generators = tuple(FakeCudaGenerator() for _ in range(devices))
    with monkeypatch.context() as patch:
        patch.setattr(torch.cuda, "is_available", lambda: True)
        patch.setattr(torch.cuda, "device_count", lambda: devices)
        patch.setattr(torch.cuda, "default_generators", generators)
        patch.setattr(torch.cuda.random, "is_initialized", lambda: True)
        patch.setattr(torch.cuda.random, "current_device", lambda: 0)
        patch.setattr(torch.cuda.random, "_lazy_call", lambda callback, **kwargs: callback())
        yield generators


def write_gpu_checkpoint(nb, tmp_path, monkeypatch):
    """A checkpoint as a 2-GPU machine writes it: every storage tagged cuda:0, rng["cuda"] a list of 2 states."""
    cfg, model, batch = tiny_setup(nb, tmp_path, "gpu-ckpt", gpu=True)
    optimizer, scaler = nb.make_optimizer(model, cfg), torch.amp.GradScaler("cpu")
    for step in (1, 2):
        nb.train_step(model, batch, optimizer, scaler, torch.float16, cfg, step)
    cuda_states = [torch.arange(16, dtype=torch.uint8), torch.arange(16, 32, dtype=torch.uint8)]
    path = tmp_path / "checkpoints" / "last.pt"
    with storages_tagged("cuda:0"), monkeypatch.context() as patch:
        patch.setattr(torch.cuda, "is_available", lambda: True)
        patch.setattr(torch.cuda, "get_rng_state_all", lambda: [s.clone() for s in cuda_states])
        nb.save_checkpoint(path, model, optimizer, scaler, nb.TrainState(step=2, epoch=1), {"data": "x"})
    with zipfile.ZipFile(path) as archive:
        pickled = archive.read(next(n for n in archive.namelist() if n.endswith("data.pkl")))
    assert b"cuda:0" in pickled and b"cpu" not in pickled, "the storages are not tagged as CUDA storages"
    with pytest.raises(RuntimeError, match="CUDA"):  # without map_location a CPU cannot read it
        torch.load(path, weights_only=False)
    return cfg, model, optimizer, batch, path, cuda_states


@pytest.mark.parametrize("gpus", [0, 1, 2])
def test_checkpoint_from_a_two_gpu_machine_resumes_here(nb, tmp_path, monkeypatch, gpus):
    """A checkpoint with CUDA-tagged storages and the random states of 2 GPUs resumes on a CPU-only machine and on
    machines with 1 or 2 GPUs (simulated): weights, Adam's state and step restored, GPU 0's random state restored
    (the notebook trains on one device), and training goes on."""
    cfg, model, _, batch, path, cuda_states = write_gpu_checkpoint(nb, tmp_path, monkeypatch)
    nb.seed_everything(99)
    again = nb.build_model(cfg, nb.VOCAB)
    again_optimizer, again_scaler = nb.make_optimizer(again, cfg), torch.amp.GradScaler("cpu", init_scale=1.0)
    with cuda_machine(monkeypatch, gpus) if gpus else contextlib.nullcontext(()) as generators:
        state = nb.load_checkpoint(path, again, again_optimizer, again_scaler, {"data": "x"})
    assert (state.step, state.epoch) == (2, 1)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values(), strict=True))
    assert all(t.device == CPU for s in again_optimizer.state.values() for t in s.values())
    assert {int(s["step"]) for s in again_optimizer.state.values()} == {2}
    assert again_scaler.get_scale() == 2.0**16
    if gpus:
        assert [len(g.states) for g in generators] == [1] + [0] * (gpus - 1)  # GPU 0's state, on GPU 0 only
        assert torch.equal(generators[0].states[0], cuda_states[0])
    loss = nb.train_step(again, batch, again_optimizer, again_scaler, torch.float16, cfg, 3)
    assert torch.isfinite(loss) and {int(s["step"]) for s in again_optimizer.state.values()} == {3}


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


# ---------------------------------------------------------------- skipped steps, counted (LossWindow)
def test_training_counts_skipped_steps(nb, tmp_path):
    cfg, model, train, valid = small_setup(nb, tmp_path, "nan-run")
    calls = []

    def poison_third_training_call(module, inputs, output):
        calls.append(module.training)
        return output * float("nan") if module.training and calls.count(True) == 3 else output

    model.register_forward_hook(poison_third_training_call)
    state = nb.train(model, train, valid, cfg, torch.device("cpu"), {}, max_steps=6)
    assert state.skipped_steps == 1
    assert finite(model) and all(map(math.isfinite, state.history["train_loss"]))


def test_overflowing_gradients_of_a_finite_loss_are_counted_as_skipped(nb, tmp_path, monkeypatch):
    """With fp16 the scaler also skips steps whose loss is finite but whose gradients overflowed: the count comes
    from Adam's own step counter, so those are counted too, and the weights are left as they were."""
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
    assert finite(model)


# ---------------------------------------------------------------- the weights kept for averaging (weight_files, snapshot_if_due)
def test_stray_files_beside_the_weights_are_not_taken_for_them(nb, tmp_path):
    """Only {kind}{N}.pt files count as kept weights: a sync conflict's copy 'epoch3 (1).pt', a temporary file and
    'epochs.pt' beside the epoch files do not."""
    (tmp_path / "checkpoints").mkdir()
    for name in ("epoch1.pt", "epoch3.pt", "epoch3 (1).pt", "epoch2.pt.123-abcd.tmp", "epochs.pt", "epoch10.pt"):
        torch.save(tiny_weights(1.0), tmp_path / "checkpoints" / name)
    assert [p.name for p in nb.weight_files(tmp_path, "epoch")] == ["epoch1.pt", "epoch3.pt", "epoch10.pt"]


def test_final_stretch_snapshots_are_evenly_spaced_and_end_with_the_last_weights(nb, tmp_path):
    """average_last snapshots over the final average_span of the planned steps: with 3 over the last 30 %, at the
    first steps past 80 %, 90 % and 100 % of the plan; the last one is the final weights. Epoch ends are kept
    beside them."""
    cfg, model, train, valid = small_setup(nb, tmp_path, "stretch", epochs=4, average_last=3, average_span=0.3)
    nb.train(model, train, valid, cfg, torch.device("cpu"), {})
    planned = 4 * len(train)
    folder = nb.run_folder(cfg, {})
    expected = [math.ceil(planned * share - 1e-9) for share in (0.8, 0.9, 1.0)]
    assert [p.name for p in nb.weight_files(folder, "snapshot")] == [f"snapshot{step}.pt" for step in expected]
    last = torch.load(folder / "checkpoints" / f"snapshot{planned}.pt", weights_only=True)
    assert all(torch.equal(last[k], v) for k, v in model.state_dict().items())
    assert [p.name for p in nb.weight_files(folder, "epoch")] == [f"epoch{e}.pt" for e in (1, 2, 3, 4)]


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
    assert [p.name for p in nb.weight_files(nb.run_folder(cfg, {}), "epoch")] == ["epoch1.pt", "epoch2.pt", "epoch3.pt"]


# ---------------------------------------------------------------- a run that diverges (DivergenceWatch)
def test_exploding_loss_stops_with_a_checkpoint_and_names_the_settings(nb, tmp_path, monkeypatch, capsys):
    """With lr_factor=1000 (on the smoke preset, left to run, a loss of 961 per token by the end of epoch 1) the loss
    window's readings stop the run within a few steps: a checkpoint is written, state.diverged and the output name
    lr_factor and warmup_steps, and re-running resumes into the same verdict without training a step."""
    cfg, model, train, valid = small_setup(nb, tmp_path, "diverge", checkpoint_every_min=60.0, lr_factor=1000.0, epochs=3)
    state = nb.train(model, train, valid, cfg, CPU, {})
    assert state.diverged.startswith("training diverged") and state.epoch == 0 and state.step < len(train)
    assert "lr_factor (now 1000)" in state.diverged and "warmup_steps (now 20)" in state.diverged
    assert state.diverged in capsys.readouterr().out
    last = last_pt(nb, cfg, {})
    assert torch.load(last, weights_only=False)["state"]["diverged"] == state.diverged
    monkeypatch.setattr(nb, "train_step", lambda *args, **kwargs: pytest.fail("trained on after diverging"))
    _, model, _, _ = small_setup(nb, tmp_path, "diverge", checkpoint_every_min=60.0, lr_factor=1000.0, epochs=3)
    assert nb.train(model, train, valid, cfg, CPU, {}).diverged == state.diverged
    assert "lr_factor" in capsys.readouterr().out


def test_validation_loss_far_above_an_untrained_models_stops_the_run(nb, tmp_path, monkeypatch, capsys):
    """A validation NLL of 800 per token (as an exploded run gives): finish_epoch's progress line prints an infinite
    perplexity, and the run stops after that epoch, saying it diverged."""
    cfg, model, train, valid = small_setup(nb, tmp_path, "val-diverge", checkpoint_every_min=60.0, epochs=3)
    monkeypatch.setattr(nb, "validation_loss", lambda *args, **kwargs: (800.0, 800.0))
    state = nb.train(model, train, valid, cfg, CPU, {})
    out = capsys.readouterr().out
    assert "valid ppl inf" in out and "validation NLL is 800" in state.diverged and "lr_factor" in out
    assert state.epoch == 1 and state.history["val_nll"] == [800.0]


def test_persistently_skipped_steps_stop_the_run(nb, tmp_path):
    """A model whose loss is NaN at every step (weights finite, activations overflowing) has every step skipped by
    the gradient scaler: two readings of the loss in a row (after step 1, then at step log_every) with every step
    skipped stop the run, naming the settings; a few skipped steps do not (see test_training_counts_skipped_steps)."""
    cfg, model, train, valid = small_setup(nb, tmp_path, "all-nan", checkpoint_every_min=60.0, epochs=3)
    model.register_forward_hook(lambda module, inputs, output: output * float("nan") if module.training else output)
    state = nb.train(model, train, valid, cfg, CPU, {})
    assert "steps were all skipped" in state.diverged and "warmup_steps" in state.diverged
    assert state.step == state.skipped_steps == cfg.log_every


# ---------------------------------------------------------------- Stop, and the time budget (train)
def test_keyboard_interrupt_saves_and_returns(nb, tmp_path, monkeypatch, capsys):
    """Stop pressed during training (SIGINT, here at the start of step 5): train() finishes that step, saves last.pt
    there, prints that it was interrupted and returns the state instead of raising; re-running resumes and goes on
    to max_steps."""
    cfg, model, train, valid = small_setup(nb, tmp_path, "stop", checkpoint_every_min=60.0)
    assert len(train) > 8  # no epoch ends (and so no epoch-end checkpoint) within these steps
    calls, real_train_step = [], nb.train_step

    def stop_on_fifth_call(*args, **kwargs):
        calls.append(1)
        if len(calls) == 5:
            signal.raise_signal(signal.SIGINT)
        return real_train_step(*args, **kwargs)

    monkeypatch.setattr(nb, "train_step", stop_on_fifth_call)
    capsys.readouterr()
    try:
        state = nb.train(model, train, valid, cfg, CPU, {"test": 1}, max_steps=8)
    except KeyboardInterrupt:
        pytest.fail("KeyboardInterrupt propagated out of train()")
    assert state.step == 5
    last = last_pt(nb, cfg, {"test": 1})
    assert last.exists() and saved_step(last) == 5
    assert "interrupted at step 5: checkpoint saved" in capsys.readouterr().out

    monkeypatch.setattr(nb, "train_step", real_train_step)
    _, model, _, _ = small_setup(nb, tmp_path, "stop", checkpoint_every_min=60.0)
    state = nb.train(model, train, valid, cfg, CPU, {"test": 1}, max_steps=8)
    assert "resumed from" in capsys.readouterr().out
    assert state.step == 8 and saved_step(last) == 8


@pytest.mark.parametrize("every_min, kept", [(1e-9, 4), (60.0, None)], ids=["checkpoint-each-step", "none-yet"])
def test_a_second_stop_in_the_middle_of_a_step_keeps_the_last_checkpoint(nb, tmp_path, monkeypatch, capsys,
                                                                          every_min, kept):
    """A KeyboardInterrupt inside a step (a second Stop, or one outside the main thread) cannot be saved as it
    stands (the step's random draws are made, its update maybe not): train() returns without raising, writes
    nothing, and says which checkpoint is kept; re-running resumes from it and reaches the uninterrupted result."""
    cfg, model, train, valid = small_setup(nb, tmp_path, "stop-now", checkpoint_every_min=every_min)
    calls, real_train_step = [], nb.train_step

    def interrupt_fifth_call(*args, **kwargs):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real_train_step(*args, **kwargs)

    monkeypatch.setattr(nb, "train_step", interrupt_fifth_call)
    capsys.readouterr()
    assert nb.train(model, train, valid, cfg, CPU, {"test": 1}, max_steps=8).step == 4
    last = last_pt(nb, cfg, {"test": 1})
    assert (saved_step(last) if last.exists() else None) == kept
    assert f"interrupted mid-step: the last checkpoint written (step {kept or 0}) is kept" in capsys.readouterr().out
    assert lock_is_free(nb.run_folder(cfg, {"test": 1}))
    monkeypatch.setattr(nb, "train_step", real_train_step)
    _, model, _, _ = small_setup(nb, tmp_path, "stop-now", checkpoint_every_min=every_min)
    assert nb.train(model, train, valid, cfg, CPU, {"test": 1}, max_steps=8).step == 8


def test_stop_pressed_in_the_middle_of_a_step_resumes_exactly(nb, tmp_path, monkeypatch, capsys):
    """Stop (a real SIGINT, as the notebook's interrupt sends) arriving inside step k's forward pass, after its
    dropout masks were drawn: the step finishes, training stops before the next one and saves; resumed in a fresh
    model it ends bit-for-bit equal to an uninterrupted run. Without waiting for the step's end, the checkpoint would
    hold the random state after that step's draws, and the resumed run would draw other masks. Afterwards SIGINT has
    the handler it had before training (the default one in a notebook; "ignore" under nohup or in a background job)."""
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
    before = signal.getsignal(signal.SIGINT)
    with contextlib.ExitStack() as restore:
        if before is signal.SIG_IGN:  # under nohup a SIGINT would be ignored: Python's handler, for this test only
            restore.callback(signal.signal, signal.SIGINT, signal.signal(signal.SIGINT, signal.default_int_handler))
            before = signal.default_int_handler
        stopped = nb.train(model2, train, valid, cfg2, torch.device("cpu"), fingerprint, max_steps=total)
        assert signal.getsignal(signal.SIGINT) is before  # Stop acts as it did before training
    assert stopped.step == k and "interrupted at step 3" in capsys.readouterr().out
    monkeypatch.setattr(nb, "batch_loss", real_batch_loss)
    _, model3, _, _ = small_setup(nb, tmp_path, "stopped")
    torch.manual_seed(999)
    resumed = nb.train(model3, train, valid, cfg2, torch.device("cpu"), fingerprint, max_steps=total)
    assert resumed.step == straight.step == total
    for (name, a), b in zip(model.state_dict().items(), model3.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_a_run_resumed_with_fewer_epochs_stops_at_once(nb, tmp_path, monkeypatch, capsys):
    """cfg.epochs lowered below the epochs a run has done: re-running the training cell trains no step and says the
    epochs are done (the loop's test is epoch >= epochs, not ==)."""
    cfg, model, train, valid = small_setup(nb, tmp_path, "fewer", checkpoint_every_min=60.0, epochs=2)
    assert nb.train(model, train, valid, cfg, CPU, {}).epoch == 2
    monkeypatch.setattr(nb, "train_step", lambda *args, **kwargs: pytest.fail("trained past cfg.epochs"))
    _, model, _, _ = small_setup(nb, tmp_path, "fewer", checkpoint_every_min=60.0, epochs=1)
    capsys.readouterr()
    assert nb.train(model, train, valid, dataclasses.replace(cfg, epochs=1), CPU, {}).epoch == 2
    assert "trained all epochs at step" in capsys.readouterr().out


def test_time_budget_stops_cleanly_with_a_checkpoint(nb, tmp_path, capsys):
    cfg, model, train, valid = small_setup(nb, tmp_path, "budget", time_budget_min=1e-9)
    state = nb.train(model, train, valid, cfg, torch.device("cpu"), {})
    assert state.step <= 1 and state.epoch == 0
    assert last_pt(nb, cfg, {}).exists()
    assert "stopped (the time budget reached) at step" in capsys.readouterr().out


# ---------------------------------------------------------------- an edited model trains in its own folder
def test_an_edited_model_trains_in_its_own_folder(nb, tmp_path, monkeypatch, capsys):
    """The pre-norm exercise as a student does it: the residual class defined again in the notebook (the same
    parameter names and shapes, wired otherwise), the model rebuilt and trained. Its code differs, so it trains in
    its own folder beside the first run's, which stays; nothing is resumed from weights that other code trained.
    A checkpoint of the first code found where the edited model looks (as a folder given by hand once had it) is
    refused, naming the model code, and the advice works."""
    monkeypatch.chdir(tmp_path)  # runs/ goes here
    monkeypatch.delenv("TRANSFORMER_WORK_DIR", raising=False)
    cfg, post, train, valid = small_setup(nb, tmp_path, "unused", work_dir="")
    nb.train(post, train, valid, cfg, CPU, nb.model_fingerprint(cfg, "d", post), max_steps=2)
    original = nb.PostNormResidual
    try:
        exec(PRE_NORM, vars(nb))  # noqa: S102 - the student's edit, made in the notebook's own namespace
        pre = nb.build_model(cfg, nb.VOCAB)
    finally:
        nb.PostNormResidual = original
    assert [(n, p.shape) for n, p in pre.named_parameters()] == [(n, p.shape) for n, p in post.named_parameters()]
    pre_folder, post_folder = (nb.run_folder(cfg, nb.model_fingerprint(cfg, "d", m)) for m in (pre, post))
    assert pre_folder != post_folder and pre_folder.parent == post_folder.parent == nb.run_folder(cfg)
    assert nb.model_code(nb.build_model(cfg, nb.VOCAB)) == nb.model_code(post)  # the same code, the same folder
    capsys.readouterr()
    state = nb.train(pre, train, valid, cfg, CPU, nb.model_fingerprint(cfg, "d", pre), max_steps=2)
    assert state.step == 2 and "resumed" not in capsys.readouterr().out
    assert (post_folder / "checkpoints" / "last.pt").exists()  # the first run stays

    mine = dataclasses.replace(cfg, work_dir=str(tmp_path / "mine"))
    nb.train(post, train, valid, mine, CPU, nb.model_fingerprint(mine, "d", post), max_steps=1)
    plant_checkpoint(nb, mine, nb.model_fingerprint(mine, "d", post), nb.model_fingerprint(mine, "d", pre))
    with pytest.raises(ValueError, match=r"model code differ.*`cfg\.work_dir = \"\"`"):
        nb.train(pre, train, valid, mine, CPU, nb.model_fingerprint(mine, "d", pre), max_steps=3)
    mine.work_dir = ""  # the advice, followed in the running notebook
    assert nb.train(pre, train, valid, mine, CPU, nb.model_fingerprint(mine, "d", pre), max_steps=3).step == 3
    assert "resumed from" in capsys.readouterr().out  # the pre-norm run of above, in its own folder


def test_model_code_is_the_same_in_every_process(nb, tmp_path):
    """The model's folder is found again after a restart: model_code does not depend on the process (the hash seed
    that orders a frozenset's constants, object addresses)."""
    script = ("import sys\nfrom nbloader import load_notebook, notebook_environment\n"
              "with notebook_environment('smoke', sys.argv[1], sys.argv[2]):\n"
              "    m = load_notebook('sections_0_to_8', until='## 9.')\n"
              "print(m.model_code(m.build_model(m.cfg, m.VOCAB)))\n")
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(ROOT / "tests")}
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "work"), str(SLICE)], capture_output=True,
                          text=True, env=env, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == nb.model_code(nb.build_model(nb.cfg, nb.VOCAB))


@pytest.mark.parametrize("edit", ["method", "helper function", "default value"])
def test_model_code_sees_edits_outside_the_models_own_classes(nb, monkeypatch, edit):
    """model_code follows the model's code wherever it lives in the notebook: a method of the model's class
    (Transformer.embed without the sqrt(d_model) scale), a function it calls (padding_mask), a default
    argument (MultiHeadAttention.forward's causal): each edit, made in the notebook's namespace, changes the hash."""
    model = nb.build_model(nb.cfg, nb.VOCAB)
    before = nb.model_code(model)
    source = {"method": "Transformer.embed = lambda self, tokens, offset=0: self.embed_dropout(\n"
                                  "    self.embedding(tokens) + self.positions[offset: offset + tokens.size(1)])\n",
              "helper function": "def padding_mask(tokens):\n"
                                 "    return (tokens == PAD)[:, None, None, :]\n",
              "default value": "MultiHeadAttention.forward.__defaults__ = (None, None, True, None, None, None)\n"}[edit]
    saved = {name: vars(nb)[name] for name in ("padding_mask",)}
    saved_embed, saved_defaults = nb.Transformer.embed, nb.MultiHeadAttention.forward.__defaults__
    try:
        exec(source, vars(nb))  # noqa: S102 - the student's edit, made in the notebook's own namespace
        assert nb.model_code(model) != before
    finally:
        vars(nb).update(saved)
        nb.Transformer.embed, nb.MultiHeadAttention.forward.__defaults__ = saved_embed, saved_defaults
    assert nb.model_code(model) == before


# ---------------------------------------------------------------- the loop on the page (issue 43)
def test_the_training_loop_is_on_the_page(nb):
    """train() is a visible cell of at most 50 lines in which the reader sees the loop: each epoch's order, the step,
    when the loss is read, the snapshots, the validation, the checkpoints, and every reason to stop."""
    import nbformat
    from nbloader import NOTEBOOK

    cell = next(c for c in nbformat.read(NOTEBOOK, as_version=4).cells
                if c.cell_type == "code" and c.source.startswith("def train("))
    assert "cellView" not in cell.metadata and len(cell.source.splitlines()) <= 50
    for seen in ("epoch_order(", "train_step(", "cfg.log_every", "log.read(", "snapshot_if_due(", "validation_loss(",
                 "cfg.checkpoint_every_min", "save_checkpoint(", "state.epoch >= cfg.epochs", "stop.is_set()",
                 "cfg.time_budget_min", "state.diverged", "max_steps"):
        assert seen in cell.source, seen


def test_each_epoch_line_gives_the_mean_loss_of_the_epochs_steps(nb, tmp_path, monkeypatch, capsys):
    """The line printed at an epoch's end: the training loss per target token over the epoch's steps, however
    log_every falls (it used to be the mean of the steps since the last reading, a window of any length); after a
    resume mid-epoch, over the steps since the resume, which the line counts."""
    cfg, model, train, valid = small_setup(nb, tmp_path, "epoch-lines", log_every=4)
    n = len(train)
    assert n % cfg.log_every and n > 4  # the last reading of an epoch falls before its end
    sums, tokens, real_train_step = [], [], nb.train_step

    def recording(forward, batch, *args, **kwargs):
        loss = real_train_step(forward, batch, *args, **kwargs)
        sums.append(loss.item())
        tokens.append(batch.n_tokens)
        return loss

    monkeypatch.setattr(nb, "train_step", recording)
    nb.train(model, train, valid, cfg, CPU, {}, max_steps=n + 2)  # stopped 2 steps into epoch 2
    nb.train(model, train, valid, cfg, CPU, {}, max_steps=2 * n)  # resumed: the rest of epoch 2
    lines = re.findall(r"epoch +(\d): step +\d+, train loss ([\d.]+) \(mean of (\d+) steps\)", capsys.readouterr().out)
    spans = {1: (0, n), 2: (n + 2, 2 * n)}
    assert [int(e) for e, _, _ in lines] == [1, 2]
    for epoch, mean, steps in lines:
        first, last = spans[int(epoch)]
        assert int(steps) == last - first
        assert float(mean) == pytest.approx(sum(sums[first:last]) / sum(tokens[first:last]), abs=6e-4)
