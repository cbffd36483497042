"""The second round of faults users run into when they experiment (issue 21): a damaged file in the work folder, a
run whose loss explodes, two runs on one work folder, settings or data that leave nothing to do, and text that is
not what it seems. Each test failed on the notebook before its fix: a raw library error, a silent wrong result or a
lost checkpoint."""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import math
import os
import re
import socket
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
import torch
from training_setup import small_setup as shared_small_setup

ROOT = Path(__file__).resolve().parent.parent
CPU = torch.device("cpu")


def small_setup(nb, tmp_path: Path, name: str, **overrides):
    return shared_small_setup(nb, tmp_path, name, **{"checkpoint_every_min": 60.0, **overrides})


def truncate_to_half(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def messages(record, category=UserWarning) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, category)]


def tiny_weights(value: float) -> dict:
    return {"w": torch.full((2,), value), "b": torch.full((1,), -value)}


# ---------------------------------------------------------------- 1. a damaged file in the work folder
def test_damaged_tokenizer_is_trained_again(nb, tmp_path, monkeypatch):
    """Before: a tokenizer file cut short by a crash failed with tokenizers' bare 'EOF while parsing a string at line
    1 column 10477', naming no file, at every re-run. Now a warning names the file, the tokenizer is trained again
    (BPE training is deterministic: the same vocabulary) and saved over the damaged one."""
    cfg = dataclasses.replace(nb.cfg, work_dir=str(tmp_path), vocab_size=300)
    corpus = {split: tuple(lines[:300] for lines in nb.corpus[split]) for split in nb.SPLITS}
    first = nb.load_or_train_bpe(cfg, corpus)
    [path] = list(tmp_path.glob("bpe-300-*.json"))
    truncate_to_half(path)
    with pytest.warns(UserWarning) as record:
        again = nb.load_or_train_bpe(cfg, corpus)
    assert any(str(path) in m and "damaged" in m for m in messages(record)), messages(record)
    assert again.get_vocab() == first.get_vocab()
    assert json.loads(path.read_text())  # whole again
    assert nb.load_or_train_bpe(cfg, corpus).get_vocab() == first.get_vocab()


def test_an_average_leaves_out_a_damaged_member_and_names_it(nb, tmp_path):
    """Before: one truncated epoch file among those averaged failed the evaluation with torch's 'PytorchStreamReader
    failed reading zip archive: failed finding central directory', naming no file. Now averaging_sets leaves it out
    with a warning naming it, reaches back one epoch to keep average_last intact files, and the label counts the
    files really averaged; average_checkpoints given a damaged file also leaves it out and names it."""
    cfg = nb.make_config("smoke", average_last=3)
    for epoch in (1, 2, 3, 4):
        torch.save(tiny_weights(float(epoch)), tmp_path / f"epoch{epoch}.pt")
    for step in (10, 20):
        torch.save(tiny_weights(float(step)), tmp_path / f"snapshot{step}.pt")
    truncate_to_half(tmp_path / "epoch3.pt")
    truncate_to_half(tmp_path / "snapshot20.pt")
    with pytest.warns(UserWarning) as record:
        sets = nb.averaging_sets(tmp_path, cfg)
    assert sets == {"epoch-end average of 3": [tmp_path / f"epoch{e}.pt" for e in (1, 2, 4)]}  # one snapshot: none
    for name in ("epoch3.pt", "snapshot20.pt"):
        assert any(str(tmp_path / name) in m and "left out" in m for m in messages(record)), messages(record)
    with pytest.warns(UserWarning, match=re.escape(str(tmp_path / "epoch3.pt"))):
        average = nb.average_checkpoints([tmp_path / f"epoch{e}.pt" for e in (2, 3, 4)])
    assert average["w"].tolist() == [3.0, 3.0]


def test_evaluation_cells_run_past_damaged_weight_files(nb, tmp_path):
    """Before: the evaluation cell read last.pt back and averaged every snapshot, and the BLEU-per-epoch cell loaded
    every epoch file: one damaged file (or last.pt damaged after training) stopped each with torch's zip-archive
    error. Now the evaluation scores the weights training ended with (kept in memory) and the intact files, and the
    BLEU-per-epoch cell leaves the damaged file out; each names it in a warning."""
    ckpt_dir = tmp_path / "checkpoints"
    ckpt_dir.mkdir()
    model = nb.build_model(nb.cfg, nb.VOCAB)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    for name in ("epoch1.pt", "epoch2.pt", "epoch3.pt", "snapshot5.pt", "snapshot6.pt", "last.pt"):
        torch.save(weights, ckpt_dir / name)
    for name in ("epoch2.pt", "snapshot6.pt", "last.pt"):
        truncate_to_half(ckpt_dir / name)
    cfg = dataclasses.replace(nb.cfg, work_dir=str(tmp_path), max_eval_sentences=3, max_extra_len=3, average_last=3)
    corpus = {split: tuple(lines[:3] for lines in nb.corpus[split]) for split in nb.SPLITS}
    with pytest.warns(UserWarning) as record:
        evaluation = nb.evaluate(model, weights, corpus, nb.tokenizer, cfg, CPU, nb.STYLE)
    assert list(evaluation["valid_greedy_bleu"]) == ["last", "epoch-end average of 2"]
    assert any(str(ckpt_dir / "epoch2.pt") in m for m in messages(record)), messages(record)
    assert any(str(ckpt_dir / "snapshot6.pt") in m for m in messages(record)), messages(record)
    assert json.loads((tmp_path / "results.json").read_text())["test_sentences"] == 3
    with pytest.warns(UserWarning) as record:
        scores = nb.bleu_of_each_file(model, nb.tokenizer, corpus, cfg, CPU, nb.STYLE)
    assert all(any(str(ckpt_dir / name) in m for m in messages(record)) for name in ("epoch2.pt", "snapshot6.pt"))
    assert sorted(scores["epoch"]) == [1, 3] and sorted(scores["snapshot"]) == [5]
    nb.plot_bleu_of_each_file(scores, {"epoch_step": [10, 20, 30]}, evaluation)
    plt.close("all")


def test_stray_files_beside_the_weights_are_not_taken_for_them(nb, tmp_path):
    """Before: a sync conflict's copy 'epoch3 (1).pt' beside the epoch files failed the averaging with "invalid
    literal for int() with base 10: '3 (1)'". Now only {kind}{N}.pt files count; temporary files never did."""
    for name in ("epoch1.pt", "epoch3.pt", "epoch3 (1).pt", "epoch2.pt.123-abcd.tmp", "epochs.pt"):
        torch.save(tiny_weights(1.0), tmp_path / name)
    assert [p.name for p in nb.saved_weights(tmp_path, "epoch")] == ["epoch1.pt", "epoch3.pt"]


def test_results_and_history_are_written_through_a_rename(nb, tmp_path, monkeypatch):
    """Before: results.json and history.json were written in place, so a crash (or a second run) mid-write left half
    a file. Now write_json writes a temporary file and renames it: a failed write leaves the old file whole and no
    temporary file behind."""
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


def test_damaged_multi30k_download_is_fetched_again(nb, tmp_path, monkeypatch):
    """Before: a downloaded Multi30k file cut short (a full disk, a sync conflict) was kept forever, and the folder
    reader blamed the user's alignment. Now a file without its split's known number of lines is downloaded again,
    with a warning naming it."""
    fetched = []

    def fake_urlopen(url, timeout):
        fetched.append(url)
        return io.BytesIO(gzip.compress(b"one\ntwo\nthree\n"))

    monkeypatch.setattr(nb.urllib.request, "urlopen", fake_urlopen)
    monkeypatch.setattr(nb, "MULTI30K_LINES", {"train": 3, "validation": 3, "test": 3})
    folder = nb.download_multi30k(tmp_path / "m30k")
    assert len(fetched) == 6
    (folder / "train.en").write_text("one\n")
    with pytest.warns(UserWarning, match=re.escape(str(folder / "train.en"))):
        nb.download_multi30k(folder)
    assert len(fetched) == 7 and fetched[-1].endswith("train.en.gz")
    assert (folder / "train.en").read_text() == "one\ntwo\nthree\n"


# ---------------------------------------------------------------- 2. a run whose loss explodes
def test_exploding_loss_stops_with_a_checkpoint_and_names_the_settings(nb, tmp_path, monkeypatch, capsys):
    """Before: with lr_factor=1000 (the smoke preset: a loss of 961 per token by the end of epoch 1) training ran on
    until math.exp(val_nll) raised OverflowError in finish_epoch, naming nothing. Now the loss window's readings stop
    the run within a few steps: a checkpoint is written, state.diverged and the output name lr_factor and
    warmup_steps, and re-running resumes into the same verdict without training a step."""
    cfg, model, train, valid = small_setup(nb, tmp_path, "diverge", lr_factor=1000.0, epochs=3)
    state = nb.train(model, train, valid, cfg, CPU, {})
    assert state.diverged.startswith("training diverged") and state.epoch == 0 and state.step < len(train)
    assert "lr_factor (now 1000)" in state.diverged and "warmup_steps (now 20)" in state.diverged
    assert state.diverged in capsys.readouterr().out
    last = Path(cfg.work_dir) / "checkpoints" / "last.pt"
    assert torch.load(last, weights_only=False)["state"]["diverged"] == state.diverged
    monkeypatch.setattr(nb, "train_step", lambda *args, **kwargs: pytest.fail("trained on after diverging"))
    _, model, _, _ = small_setup(nb, tmp_path, "diverge", lr_factor=1000.0, epochs=3)
    assert nb.train(model, train, valid, cfg, CPU, {}).diverged == state.diverged
    assert "lr_factor" in capsys.readouterr().out


def test_validation_loss_far_above_an_untrained_models_stops_the_run(nb, tmp_path, monkeypatch, capsys):
    """Before: a validation NLL of 800 per token (as an exploded run gives) raised OverflowError from math.exp in
    finish_epoch's progress line. Now the line prints an infinite perplexity, and the run stops after that epoch,
    saying it diverged."""
    cfg, model, train, valid = small_setup(nb, tmp_path, "val-diverge", epochs=3)
    monkeypatch.setattr(nb, "validation_loss", lambda *args, **kwargs: (800.0, 800.0))
    state = nb.train(model, train, valid, cfg, CPU, {})
    out = capsys.readouterr().out
    assert "valid ppl inf" in out and "validation NLL is 800" in state.diverged and "lr_factor" in out
    assert state.epoch == 1 and state.history["val_nll"] == [800.0]


def test_persistently_skipped_steps_stop_the_run(nb, tmp_path, monkeypatch):
    """Before: a model whose loss is NaN at every step (weights finite, activations overflowing) had every step
    skipped by the gradient scaler, and trained on for hours doing nothing. Now DIVERGED_SKIPS steps skipped in a
    row stop it, naming the settings; a few skipped steps do not (see test_training_reports_skipped_steps)."""
    monkeypatch.setattr(nb, "DIVERGED_SKIPS", 6)
    cfg, model, train, valid = small_setup(nb, tmp_path, "all-nan", epochs=3)
    model.register_forward_hook(lambda module, inputs, output: output * float("nan") if module.training else output)
    state = nb.train(model, train, valid, cfg, CPU, {})
    assert "6 steps were all skipped" in state.diverged and "warmup_steps" in state.diverged
    assert state.step == state.skipped_steps == 6


def test_later_cells_survive_a_diverged_runs_numbers(nb, tmp_path):
    """Before: the loss-curve cell computed math.exp of each validation NLL and raised OverflowError on an exploded
    run's history. Now it draws (infinite perplexities are left out), and a diverged model decodes and scores."""
    history = {"step": [2, 4], "train_loss": [36.5, 524.5], "lr": [1e-3, 2e-3], "epoch_step": [4, 8],
               "val_loss": [800.0, math.inf], "val_nll": [800.0, float("nan")]}
    nb.plot_losses(history, nb.cfg, nb.VOCAB)
    plt.close("all")
    cfg, model, train, valid = small_setup(nb, tmp_path, "diverged-model", lr_factor=1000.0)
    assert nb.train(model, train, valid, cfg, CPU, {}).diverged
    texts = nb.corpus["test"][0][:3]
    short = dataclasses.replace(cfg, max_extra_len=5)
    for beam in (1, 2):
        hyps = nb.decode_corpus(model, nb.tokenizer, texts, short, CPU, beam)
        assert len(hyps) == 3 and math.isfinite(nb.corpus_bleu(hyps, nb.corpus["test"][1][:3])[0])


# ---------------------------------------------------------------- 3. two runs on one work folder
def test_second_run_on_a_locked_folder_refuses_and_names_the_other(nb, tmp_path, monkeypatch):
    """Two runs on one work folder of one machine (two Colab tabs, two kernels): the first holds a lock while it
    trains; the second refuses with an error naming the folder and the run that holds it (host, process). The lock
    goes when the first run ends."""
    cfg, model, train, valid = small_setup(nb, tmp_path, "shared", epochs=1)
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
        _, model2, _, _ = small_setup(nb, tmp_path, "shared", epochs=1)
        with pytest.raises(RuntimeError) as info:
            nb.train(model2, train, valid, cfg, CPU, {}, max_steps=2)
    finally:
        go_on.set()
        first_run.join(60)
    message = str(info.value)
    assert str(Path(cfg.work_dir).resolve()) in message, message
    assert socket.gethostname() in message and re.search(r"process \d+", message), message
    assert not (Path(cfg.work_dir) / ".lock").exists()
    assert nb.train(model2, train, valid, cfg, CPU, {}, max_steps=3).step == 3  # free again


def write_lock(folder: Path, host: str, pid: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / ".lock"
    path.write_text(json.dumps({"host": host, "pid": pid, "started": "2026-01-01 00:00:00", "token": "x"}))
    return path


def test_lock_of_a_dead_process_is_taken_over_and_of_a_live_one_refused(nb, tmp_path):
    """A lock left by a process of this machine that is gone (a killed kernel) is taken over with a warning naming
    that process, and training goes on; the lock of a live process of this machine is refused, naming it."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    cfg, model, train, valid = small_setup(nb, tmp_path, "dead")
    write_lock(Path(cfg.work_dir), socket.gethostname(), gone.pid)
    with pytest.warns(UserWarning, match=rf"taking over the lock .*process {gone.pid} .* is gone"):
        assert nb.train(model, train, valid, cfg, CPU, {}, max_steps=2).step == 2
    assert not (Path(cfg.work_dir) / ".lock").exists()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        write_lock(Path(cfg.work_dir), socket.gethostname(), alive.pid)
        with pytest.raises(RuntimeError, match=rf"in use by another training run \(process {alive.pid} on "):
            nb.train(model, train, valid, cfg, CPU, {}, max_steps=4)
    finally:
        alive.kill()
        alive.wait()


def test_lock_of_another_machine_or_damaged_is_taken_over(nb, tmp_path):
    """Whether a run on another machine lives cannot be told from here (and a lost Colab runtime's successor has
    another host name): its lock is taken over with a warning that says so. A damaged lock file too."""
    cfg, model, train, valid = small_setup(nb, tmp_path, "stale")
    path = write_lock(Path(cfg.work_dir), "colab-vm-gone", 4242)
    with pytest.warns(UserWarning, match=r"taking over .*colab-vm-gone.*another machine"):
        assert nb.train(model, train, valid, cfg, CPU, {}, max_steps=1).step == 1
    path.write_text('{"host": "half')
    old = time.time() - 60
    os.utime(path, (old, old))
    with pytest.warns(UserWarning, match="taking over .*damaged"):
        assert nb.train(model, train, valid, cfg, CPU, {}, max_steps=2).step == 2


@pytest.mark.parametrize("ending", ["stop", "error"])
def test_lock_is_released_on_stop_and_on_errors(nb, tmp_path, monkeypatch, ending):
    """Stop (KeyboardInterrupt) and an error inside training both release the lock, so re-running the cell in the
    same kernel trains on."""
    cfg, model, train, valid = small_setup(nb, tmp_path, ending)
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
    assert not (Path(cfg.work_dir) / ".lock").exists()
    monkeypatch.setattr(nb, "train_step", real_step)
    assert nb.train(model, train, valid, cfg, CPU, {}, max_steps=5).step == 5


def test_two_writers_of_one_file_never_clobber_each_other(nb, tmp_path, monkeypatch):
    """Before: every writer of last.pt wrote last.pt.tmp, so two at once (even without training: a second tab's
    evaluation) wrote into one temporary file and the second rename failed with FileNotFoundError. Now each write
    has its own temporary name (process id and a random part): both finish, and last.pt is one of the two whole."""
    path = tmp_path / "last.pt"
    both_written, real_save, errors = threading.Barrier(2, timeout=30), torch.save, []

    def save_then_wait(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)
        both_written.wait()  # both temporary files are written before either is renamed

    monkeypatch.setattr(nb.torch, "save", save_then_wait)

    def writer(value):
        try:
            nb.save_atomically(tiny_weights(value), path, previous=tmp_path / "previous.pt")
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
    names = {nb.temporary_path(path).name for _ in range(50)}
    assert len(names) == 50 and all(str(nb.os.getpid()) in name for name in names)


# ---------------------------------------------------------------- 4. settings and data that leave nothing to do
@pytest.mark.parametrize(("overrides", "message"), [
    ({"max_eval_sentences": 0}, r"max_eval_sentences=0 leaves nothing.*None for no limit"),
    ({"max_train_pairs": 0}, r"max_train_pairs=0 leaves nothing.*None for no limit"),  # 0 used to mean "no limit"
    ({"max_eval_sentences": -5}, "max_eval_sentences=-5"),  # [:-5] used to drop the last five
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


def test_no_training_pair_within_max_len_is_refused(nb, capsys):
    """Before: data whose pairs are all longer than max_len printed 'train: kept 0 of N pairs' and died on
    ZeroDivisionError a line later. Now encode_corpus raises an error naming max_len, the length the shortest pair
    needs, and the fix."""
    corpus = {split: tuple(lines[:20] for lines in nb.corpus[split]) for split in nb.SPLITS}
    with pytest.raises(ValueError, match=r"no training pair fits max_len=3 tokens: the shortest needs \d+.*Raise max_len"):
        nb.encode_corpus(nb.tokenizer, corpus, 3)
    held_out_too_long = {**corpus, "validation": (["Ein Hund. " * 20], ["A dog. " * 20])}
    with pytest.raises(ValueError, match="every validation pair is longer than the 16-position table.*max_positions"):
        nb.encode_corpus(nb.tokenizer, held_out_too_long, 64, max_positions=16)


# ---------------------------------------------------------------- 5. text that is not what it seems
def write_folder(folder: Path, n: int = 5) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for split in ("train", "validation", "test"):
        (folder / f"{split}.de").write_text("".join(f"Grüße {i}\n" for i in range(n)), encoding="utf-8")
        (folder / f"{split}.en").write_text("".join(f"Greetings {i}\n" for i in range(n)), encoding="utf-8")
    return folder


def read_quietly(nb, folder: Path):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*too small")
        return nb.read_parallel_folder(folder)


def test_control_characters_are_removed_with_a_warning_naming_file_and_lines(nb, tmp_path):
    """Before: a NUL, an escape or a stray carriage return inside a sentence was trained on (and scored) without a
    word. Now it is removed, with a warning naming the file, the 1-based lines and the characters; a tab stays."""
    folder = write_folder(tmp_path / "d")
    (folder / "train.de").write_text("Grüße 0\nGrü\x00ße 1\nGrüße\t2\nGrüße 3\x1b[0m\nGrü\rße 4\r\n", encoding="utf-8")
    with pytest.warns(UserWarning) as record:
        corpus = read_quietly(nb, folder)
    found = [m for m in messages(record) if "control characters" in m]
    assert len(found) == 1 and str((folder / "train.de").resolve()) in found[0], found
    assert re.search(r"line\(s\) 2, 4, 5$", found[0]) and "U+0000" in found[0] and "U+001B" in found[0], found[0]
    assert corpus["train"][0] == ["Grüße 0", "Grüße 1", "Grüße\t2", "Grüße 3[0m", "Grüße 4"]


@pytest.mark.parametrize("encoding", ["UTF-16LE", "UTF-16BE"])
@pytest.mark.parametrize("text", ["German", "ASCII"])
def test_utf16_without_byte_order_mark_gets_the_right_iconv(nb, tmp_path, encoding, text):
    """Before: UTF-16 without a byte-order mark was advised to be converted from Latin-1 (when a letter such as ü
    made it invalid UTF-8), or, all ASCII, was read silently as text with a NUL after every letter. Now the pattern of
    NUL bytes tells UTF-16 and its byte order, and the error gives iconv -f UTF-16LE or -f UTF-16BE."""
    folder = write_folder(tmp_path / "d")
    lines = "".join(f"{'Grüße' if text == 'German' else 'Hello'} number {i}\n" for i in range(5))
    (folder / "validation.de").write_bytes(lines.encode(encoding.lower().replace("utf-16", "utf-16-")))
    with pytest.raises(ValueError) as info:
        read_quietly(nb, folder)
    message = str(info.value)
    assert str((folder / "validation.de").resolve()) in message and f"iconv -f {encoding} -t UTF-8" in message, message
    assert "LATIN1" not in message


def test_utf16_converted_as_if_it_were_latin1_is_refused(nb, tmp_path):
    """Before: following the old advice (iconv -f LATIN1) on a UTF-16 file gave UTF-8 text with a NUL after every
    letter, which was then read and trained on silently. Now that is an error that names UTF-16LE and says to convert
    the original file."""
    folder = write_folder(tmp_path / "d")
    lines = "".join(f"Grüße aus Köln, Nummer {i}\n" for i in range(5))
    (folder / "train.de").write_bytes(lines.encode("utf-16-le").decode("latin-1").encode("utf-8"))
    with pytest.raises(ValueError, match=r"NUL.*UTF-16LE.*iconv -f UTF-16LE -t UTF-8 original"):
        read_quietly(nb, folder)


def test_gzip_file_is_named_as_such(nb, tmp_path):
    """Before: a data file still gzip-compressed (Multi30k's raw files are) got the advice to convert it from Latin-1.
    Now the error says it is gzip-compressed and how to decompress it."""
    folder = write_folder(tmp_path / "d")
    (folder / "test.en").write_bytes(gzip.compress(b"Greetings 0\n"))
    with pytest.raises(ValueError, match="gzip-compressed.*gunzip"):
        read_quietly(nb, folder)
