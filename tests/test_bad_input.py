"""Bad input a user may really have: a data folder with blank, misaligned or mis-encoded lines, a work folder that
cannot be written, a full disk, a damaged checkpoint, Stop pressed mid-run, wrong arguments to the decoding
functions, a Hub that never answers, a preset name with stray spaces. Each gets a clear message or a safe recovery,
never a traceback from deep inside a library or a silently wrong result."""

from __future__ import annotations

import collections
import copy
import dataclasses
import errno
import inspect
import json
import re
import shutil
import socket
import sys
import threading
import time
import types
import warnings
from pathlib import Path

import nbformat
import pytest
import torch
from nbclient import NotebookClient
from training_setup import small_setup as shared_small_setup

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "transformer.ipynb"
SLICE = ROOT / "tests" / "data" / "multi30k"
CPU = torch.device("cpu")


# ---------------------------------------------------------------- helpers
def write_split(folder: Path, split: str, de: list[str], en: list[str]) -> None:
    """folder/{split}.de and .en, one sentence per line, UTF-8, each line ended by '\\n'."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{split}.de").write_text("".join(line + "\n" for line in de), encoding="utf-8")
    (folder / f"{split}.en").write_text("".join(line + "\n" for line in en), encoding="utf-8")


def numbered(n: int) -> tuple[list[str], list[str]]:
    """n ordinary sentence pairs of similar length."""
    return [f"Satz {i}" for i in range(n)], [f"sentence {i}" for i in range(n)]


def write_folder(folder: Path, train: int = 1000, validation: int = 5, test: int = 5) -> Path:
    """A well-formed data folder with the given numbers of pairs per split."""
    for split, n in (("train", train), ("validation", validation), ("test", test)):
        write_split(folder, split, *numbered(n))
    return folder


def warning_texts(record, needle: str) -> list[str]:
    return [str(w.message) for w in record if needle in str(w.message)]


def small_setup(nb, tmp_path: Path, name: str, **overrides):
    """The shared tiny set-up, checkpointing only when training stops (so each test controls what is written)."""
    return shared_small_setup(nb, tmp_path, name, **{"checkpoint_every_min": 60.0, **overrides})


def truncate_to_half(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def saved_step(path: Path) -> int:
    return torch.load(path, map_location="cpu", weights_only=False)["state"]["step"]


# ---------------------------------------------------------------- blank lines and misalignment
def test_pairs_empty_on_both_sides_are_dropped_and_counted(nb, tmp_path, capsys):
    """Before: blank lines on both sides (a trailing blank paragraph, a double newline) became empty training
    pairs without a word. Now they are dropped, the count is printed per split, and the rest stays aligned."""
    de, en = numbered(10)
    for i in (2, 6):  # 0-based: lines 3 and 7 blank in both files
        de[i] = en[i] = ""
    write_split(tmp_path / "d", "train", de, en)
    write_split(tmp_path / "d", "validation", *numbered(3))
    write_split(tmp_path / "d", "test", *numbered(3))
    capsys.readouterr()
    corpus = nb.read_parallel_folder(tmp_path / "d")
    keep = [i for i in range(10) if i not in (2, 6)]
    assert corpus["train"] == ([f"Satz {i}" for i in keep], [f"sentence {i}" for i in keep])
    assert corpus["validation"] == numbered(3)
    lines = [line for line in capsys.readouterr().out.splitlines() if "empty on both sides" in line]
    assert any(re.search(r"\btrain\b", line) and re.search(r"\b2\b", line) for line in lines), lines
    assert not any(re.search(r"\b(validation|test)\b", line) for line in lines), lines


@pytest.mark.parametrize("case", ["shifted", "one blank"])
def test_line_empty_on_one_side_names_file_and_line(nb, tmp_path, case):
    """Before: a blank line inserted in one file and another removed (or added) elsewhere kept the line counts
    equal, so the shifted pairs trained silently on wrong translations. Now a ValueError names the file with the
    blank line and its 1-based line number."""
    folder = write_folder(tmp_path / "d", train=12)
    if case == "shifted":  # a blank at line 3 of train.de, another at line 8 of train.en: pairs 3..7 shifted
        de, en = numbered(12)
        de.insert(2, "")
        en.insert(7, "")
        write_split(folder, "train", de, en)
        path, line = folder / "train.de", 3
    else:  # validation.en line 4 blank, its German side not
        de, en = numbered(5)
        en[3] = ""
        write_split(folder, "validation", de, en)
        path, line = folder / "validation.en", 4
    with pytest.raises(ValueError) as info:
        nb.read_parallel_folder(folder)
    message = str(info.value)
    assert str(path.resolve()) in message, message
    assert re.search(rf"\bline {line}\b", message), message


# ---------------------------------------------------------------- extreme length ratios
def ratio_folder(folder: Path, n: int, extreme: list[int]) -> Path:
    """train of n pairs, those at the 1-based lines `extreme` with a 3-character German side and a 50-character
    English one (ratio 51/4 > 3); the other splits ordinary."""
    de, en = numbered(n)
    for line in extreme:
        de[line - 1], en[line - 1] = "Ja.", "A very long English sentence that goes on and on."
    write_split(folder, "train", de, en)
    write_split(folder, "validation", *numbered(5))
    write_split(folder, "test", *numbered(5))
    return folder


def length_ratio_warnings(nb, folder: Path) -> list[str]:
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        nb.read_parallel_folder(folder)
    return warning_texts([w for w in record if issubclass(w.category, UserWarning)], "length ratio")


def test_many_extreme_length_ratios_warn_with_line_numbers(nb, tmp_path):
    """Before: a split whose pairs are mostly not translations of each other (a misaligned or mixed-up file) was
    read without comment. Now more than 10 % of pairs (and at least 3) with a character-length ratio above 3 give a
    UserWarning naming 'length ratio' and the 1-based lines of the first such pairs; fewer give none."""
    with pytest.warns(UserWarning, match="length ratio") as record:
        nb.read_parallel_folder(ratio_folder(tmp_path / "many", 40, [8, 14, 18, 22, 26]))  # 12.5 %
    message = warning_texts(record, "length ratio")[0]
    for line in (8, 14, 18):
        assert re.search(rf"\b{line}\b", message), message
    assert not re.search(r"\b7\b", message), message  # line numbers are 1-based
    assert length_ratio_warnings(nb, ratio_folder(tmp_path / "ten-percent", 40, [8, 14, 18, 22])) == []
    assert length_ratio_warnings(nb, ratio_folder(tmp_path / "two", 10, [3, 7])) == []  # 20 %, but only 2 pairs


def test_real_corpus_gives_no_length_ratio_warning(nb, tmp_path):
    """Before: no length check at all. Now the check exists (a folder of swapped long/short pairs warns) and an
    ordinary corpus (the first 300 lines of each Multi30k split kept in tests/data) gives no such warning."""
    folder = tmp_path / "m30k"
    for split in ("train", "validation", "test"):
        write_split(folder, split, *((SLICE / f"{split}.{lang}").read_text(encoding="utf-8").split("\n")[:300]
                                     for lang in ("de", "en")))
    assert length_ratio_warnings(nb, folder) == []
    de, en = numbered(30)
    de[:10] = ["Ja."] * 10
    en[:10] = ["A very long English sentence that goes on and on."] * 10
    write_split(folder, "test", de, en)
    assert length_ratio_warnings(nb, folder) != []


# ---------------------------------------------------------------- encodings and whitespace
def test_byte_order_mark_and_trailing_whitespace_are_stripped(nb, tmp_path):
    """Before: a file saved by Notepad began with '\\ufeff', which became part of the first sentence, and trailing
    spaces, tabs and '\\r' stayed in the text. Now the BOM and trailing whitespace are stripped; leading
    whitespace is kept."""
    folder = write_folder(tmp_path / "d", train=3)
    (folder / "train.de").write_bytes("\ufeffEin Hund läuft. \t\r\n  Zwei Katzen.\t \nDrei Vögel.\r\n".encode())
    (folder / "train.en").write_bytes("\ufeffA dog runs.\r\n  Two cats. \r\nThree birds.  \n".encode())
    corpus = nb.read_parallel_folder(folder)
    assert corpus["train"] == (["Ein Hund läuft.", "  Zwei Katzen.", "Drei Vögel."],
                               ["A dog runs.", "  Two cats.", "Three birds."])


def test_latin1_file_names_file_line_and_fix(nb, tmp_path):
    """Before: a Latin-1 file failed with "'utf-8' codec can't decode byte 0xfc in position 14", naming neither
    file nor line. Now a ValueError names the file, the line, UTF-8, and how to convert the file."""
    folder = write_folder(tmp_path / "d", train=3)
    (folder / "train.de").write_bytes(b"Ein Hund.\nGr\xfc\xdfe\nDrei.\n")
    with pytest.raises(ValueError) as info:
        nb.read_parallel_folder(folder)
    message = str(info.value)
    assert str((folder / "train.de").resolve()) in message, message
    assert re.search(r"\bline 2\b", message), message
    assert "UTF-8" in message, message
    assert "iconv" in message or "convert" in message, message


def test_utf16_file_is_named(nb, tmp_path):
    """Before: a UTF-16 file (Windows 'Unicode' text) failed with "can't decode byte 0xff in position 0". Now a
    ValueError names the file and says it is UTF-16."""
    folder = write_folder(tmp_path / "d", train=3)
    (folder / "validation.en").write_bytes("".join(f"sentence {i}\n" for i in range(5)).encode("utf-16"))
    with pytest.raises(ValueError) as info:
        nb.read_parallel_folder(folder)
    message = str(info.value)
    assert str((folder / "validation.en").resolve()) in message, message
    assert "UTF-16" in message, message


# ---------------------------------------------------------------- the folder itself
def test_data_dir_that_is_a_file(nb, tmp_path):
    """Before: TRANSFORMER_DATA_DIR naming a file said the folder 'does not exist', though it plainly did. Now a
    NotADirectoryError says that TRANSFORMER_DATA_DIR is a file."""
    path = tmp_path / "corpus.tsv"
    path.write_text("Ein Hund.\tA dog.\n", encoding="utf-8")
    with pytest.raises(NotADirectoryError) as info:
        nb.read_parallel_folder(path)
    assert "TRANSFORMER_DATA_DIR" in str(info.value) and "is a file" in str(info.value), str(info.value)


def test_split_file_that_is_a_folder(nb, tmp_path):
    """Before: a folder named train.de was reported as 'missing'. Now an IsADirectoryError names it and says it is
    a folder."""
    folder = write_folder(tmp_path / "d")
    (folder / "train.de").unlink()
    (folder / "train.de").mkdir()
    with pytest.raises(IsADirectoryError) as info:
        nb.read_parallel_folder(folder)
    message = str(info.value)
    assert str((folder / "train.de").resolve()) in message and "is a folder" in message, message


def test_missing_relative_folder_names_the_absolute_path(nb, tmp_path, monkeypatch):
    """Before: a relative TRANSFORMER_DATA_DIR that does not exist was named as given ('data/de-en'), leaving the
    user to guess the working directory. Now the FileNotFoundError names the absolute path it looked in."""
    monkeypatch.chdir(tmp_path)
    relative = Path("data") / "de-en"
    with pytest.raises(FileNotFoundError) as info:
        nb.read_parallel_folder(relative)
    assert str(relative.resolve()) in str(info.value), str(info.value)


def test_small_training_split_warns_and_one_pair_evaluation_splits_are_read(nb, tmp_path):
    """Before: 50 training pairs trained without comment into a useless model. Now a UserWarning says the
    training split is too small (not for 1,000 pairs); validation and test splits of one pair each are accepted."""
    with pytest.warns(UserWarning, match="too small"):
        corpus = nb.read_parallel_folder(write_folder(tmp_path / "small", train=50, validation=1, test=1))
    assert corpus["validation"] == (["Satz 0"], ["sentence 0"]) and corpus["test"] == (["Satz 0"], ["sentence 0"])
    assert len(corpus["train"][0]) == 50
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        nb.read_parallel_folder(write_folder(tmp_path / "enough", train=1000, validation=1000, test=1000))
    assert warning_texts(record, "too small") == []


# ---------------------------------------------------------------- the work folder
def test_prepare_work_dir_creates_the_folder(nb, tmp_path):
    """Before: there was no check of the work folder until the first checkpoint failed to write. Now
    prepare_work_dir creates it, parents too, and returns it."""
    cfg = nb.make_config("smoke", work_dir=str(tmp_path / "a" / "b" / "work"))
    path = nb.prepare_work_dir(cfg)
    assert Path(path).resolve() == (tmp_path / "a" / "b" / "work").resolve()
    assert (tmp_path / "a" / "b" / "work").is_dir()
    assert not (tmp_path / "a" / "b" / "work" / ".write-test").exists()


def test_work_dir_that_is_a_file(nb, tmp_path):
    """Before: TRANSFORMER_WORK_DIR naming a file failed much later with FileExistsError from mkdir. Now
    prepare_work_dir raises NotADirectoryError naming TRANSFORMER_WORK_DIR."""
    (tmp_path / "work").write_text("not a folder")
    with pytest.raises(NotADirectoryError, match="TRANSFORMER_WORK_DIR"):
        nb.prepare_work_dir(nb.make_config("smoke", work_dir=str(tmp_path / "work")))


def test_work_dir_that_cannot_be_written(nb, tmp_path, monkeypatch):
    """Before: a read-only work folder (a mounted drive, a shared folder) failed after minutes of training, at the
    first checkpoint. Now prepare_work_dir probes it at once and raises PermissionError naming
    TRANSFORMER_WORK_DIR. (Tests run as root, where chmod blocks nothing: the probe write is made to fail.)"""
    probes = []

    def refusing(method):
        def write(self, *args, **kwargs):
            if self.name.startswith(".write-test"):
                probes.append(self)
                raise OSError(errno.EROFS, "Read-only file system", str(self))
            return method(self, *args, **kwargs)
        return write

    for name in ("write_text", "write_bytes", "touch"):
        monkeypatch.setattr(nb.Path, name, refusing(getattr(nb.Path, name)))
    with pytest.raises(PermissionError, match="TRANSFORMER_WORK_DIR"):
        nb.prepare_work_dir(nb.make_config("smoke", work_dir=str(tmp_path / "work")))
    assert probes, "prepare_work_dir did not probe the folder with a .write-test file"


# ---------------------------------------------------------------- a full disk
def test_full_disk_keeps_the_old_file_and_removes_the_partial_one(nb, tmp_path, monkeypatch):
    """Before: a full disk surfaced as torch's 'basic_ios::clear: iostream error', with a half-written .tmp file
    left behind. Now an OSError says the disk is full and the old file is intact, naming it; the .tmp file is gone
    and the old file is byte-identical."""
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
    assert not path.with_name(path.name + ".tmp").exists()
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir()) == ["last.pt"]


# ---------------------------------------------------------------- damaged checkpoints
def two_saves(nb, tmp_path: Path, name: str):
    """Train 3 steps, then resume to 5: last.pt holds step 5 and previous.pt the step-3 checkpoint it replaced."""
    cfg, model, train, valid = small_setup(nb, tmp_path, name)
    nb.train(model, train, valid, cfg, CPU, {"test": 1}, max_steps=3)
    _, model, _, _ = small_setup(nb, tmp_path, name)
    nb.train(model, train, valid, cfg, CPU, {"test": 1}, max_steps=5)
    ckpt_dir = Path(cfg.work_dir) / "checkpoints"
    assert (ckpt_dir / "previous.pt").exists(), "train() did not keep the replaced checkpoint as previous.pt"
    assert (saved_step(ckpt_dir / "last.pt"), saved_step(ckpt_dir / "previous.pt")) == (5, 3)
    return cfg, train, valid, ckpt_dir


def test_damaged_last_checkpoint_resumes_from_previous(nb, tmp_path, monkeypatch, capsys):
    """Before: a last.pt truncated by a crash or a full disk made every re-run fail with 'PytorchStreamReader failed
    reading zip archive', and the run was lost. Now train() warns that last.pt is damaged and resumes from
    previous.pt, one checkpoint older, training on from its step."""
    cfg, train, valid, ckpt_dir = two_saves(nb, tmp_path, "damaged")
    truncate_to_half(ckpt_dir / "last.pt")
    steps, real_train_step = [], nb.train_step

    def counting_train_step(*args, **kwargs):
        steps.append(inspect.signature(real_train_step).bind(*args, **kwargs).arguments["step"])
        return real_train_step(*args, **kwargs)

    monkeypatch.setattr(nb, "train_step", counting_train_step)
    _, model, _, _ = small_setup(nb, tmp_path, "damaged")
    capsys.readouterr()
    with pytest.warns(UserWarning) as record:
        state = nb.train(model, train, valid, cfg, CPU, {"test": 1}, max_steps=7)
    assert any(all(word in str(w.message) for word in ("last.pt", "damaged", "previous.pt")) for w in record), \
        [str(w.message) for w in record]
    assert re.search(r"resumed from .*previous\.pt", capsys.readouterr().out)
    assert steps == [4, 5, 6, 7] and state.step == 7
    assert saved_step(ckpt_dir / "last.pt") == 7


@pytest.mark.parametrize("previous", ["damaged", "missing"])
def test_no_intact_checkpoint_says_to_delete_last(nb, tmp_path, previous):
    """Before: a damaged last.pt gave torch's 'failed reading zip archive' with no hint. Now, when no intact
    previous.pt is left either, a RuntimeError names last.pt and says to delete it to start afresh."""
    cfg, train, valid, ckpt_dir = two_saves(nb, tmp_path, f"lost-{previous}")
    truncate_to_half(ckpt_dir / "last.pt")
    if previous == "damaged":
        truncate_to_half(ckpt_dir / "previous.pt")
    else:
        (ckpt_dir / "previous.pt").unlink()
    _, model, _, _ = small_setup(nb, tmp_path, f"lost-{previous}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(RuntimeError) as info:
            nb.train(model, train, valid, cfg, CPU, {"test": 1}, max_steps=7)
    message = str(info.value)
    assert str(ckpt_dir / "last.pt") in message and "delete" in message, message


# ---------------------------------------------------------------- Stop pressed
def test_keyboard_interrupt_saves_and_returns(nb, tmp_path, monkeypatch, capsys):
    """Before: pressing Stop during training raised KeyboardInterrupt out of the cell, and the steps since the last
    periodic checkpoint were lost. Now train() saves last.pt at the step reached, prints that it was interrupted and
    returns the state; re-running resumes and goes on to max_steps."""
    cfg, model, train, valid = small_setup(nb, tmp_path, "stop")
    assert len(train) > 8  # no epoch ends (and so no epoch-end checkpoint) within these steps
    calls, real_train_step = [], nb.train_step

    def stop_on_fifth_call(*args, **kwargs):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real_train_step(*args, **kwargs)

    monkeypatch.setattr(nb, "train_step", stop_on_fifth_call)
    capsys.readouterr()
    try:
        state = nb.train(model, train, valid, cfg, CPU, {"test": 1}, max_steps=8)
    except KeyboardInterrupt:
        pytest.fail("KeyboardInterrupt propagated out of train()")
    assert state.step == 4
    last = Path(cfg.work_dir) / "checkpoints" / "last.pt"
    assert last.exists() and saved_step(last) == 4
    assert "interrupted" in capsys.readouterr().out

    monkeypatch.setattr(nb, "train_step", real_train_step)
    _, model, _, _ = small_setup(nb, tmp_path, "stop")
    state = nb.train(model, train, valid, cfg, CPU, {"test": 1}, max_steps=8)
    assert "resumed from" in capsys.readouterr().out
    assert state.step == 8 and saved_step(last) == 8


# ---------------------------------------------------------------- decoding functions given bad arguments
@pytest.fixture
def fast(nb):
    """The untrained smoke model, its tokenizer, a config with short outputs, and the model's device."""
    return nb.model, nb.tokenizer, dataclasses.replace(nb.cfg, max_extra_len=3), next(nb.model.parameters()).device


def test_non_string_input_names_its_type(nb, fast):
    """Before: decode_corpus(model, tokenizer, [..., 5], ...) failed inside the tokenizer with "TextEncodeInput must
    be Union[...]", and translate(5) with "'int' object has no attribute 'strip'". Now a TypeError names the type."""
    model, tokenizer, cfg, device = fast
    with pytest.raises(TypeError, match=r"\bint\b"):
        nb.decode_corpus(model, tokenizer, ["Ein Hund läuft.", 5], cfg, device)
    with pytest.raises(TypeError, match=r"\bint\b"):
        nb.translate(5, model, tokenizer, cfg, device)
    with pytest.raises(TypeError, match=r"\bNoneType\b"):
        nb.decode_corpus(model, tokenizer, [None], cfg, device)


@pytest.mark.parametrize("beam", [0, -1])
def test_beam_below_one_is_refused(nb, fast, beam):
    """Before: beam=0 ran greedy decoding in translate (0 is falsy) and beam=-1 crashed in topk. Now both
    decode_corpus and translate raise a ValueError naming the beam."""
    model, tokenizer, cfg, device = fast
    with pytest.raises(ValueError, match="beam"):
        nb.decode_corpus(model, tokenizer, ["Ein Hund läuft."], cfg, device, beam=beam)
    with pytest.raises(ValueError, match="beam"):
        nb.translate("Ein Hund läuft.", model, tokenizer, cfg, device, beam=beam)


def test_translate_without_beam_uses_the_configured_beam(nb, fast, monkeypatch):
    """Before: translate used the notebook's global model, tokenizer and config. Now they are its arguments, and
    beam=None means cfg.beam_size."""
    model, tokenizer, cfg, device = fast
    cfg = dataclasses.replace(cfg, beam_size=3)
    beams, real = [], nb.beam_search

    def spy(*args, **kwargs):
        beams.append(inspect.signature(real).bind(*args, **kwargs).arguments["beam"])
        return real(*args, **kwargs)

    monkeypatch.setattr(nb, "beam_search", spy)
    out = nb.translate("Ein Hund läuft.", model, tokenizer, cfg, device)
    assert isinstance(out, str) and beams == [3]


@pytest.mark.parametrize("beam", [1, 2], ids=["greedy", "beam"])
def test_empty_sources_give_empty_outputs_and_leave_the_others_alone(nb, fast, beam):
    """Before: an empty line in the list to translate was decoded from a lone <eos> into made-up words. Now empty
    and whitespace-only sources give '' and the other sentences are translated exactly as they are alone."""
    model, tokenizer, cfg, device = fast
    model = copy.deepcopy(model)
    decode = model.decode

    def never_ending(*args, **kwargs):  # <eos> only at the length limit: an output '' cannot be a coincidence
        logits = decode(*args, **kwargs)
        logits[..., nb.EOS] -= 100.0
        return logits

    model.decode = never_ending
    texts = ["Ein Hund läuft über die Wiese.", "", "  \t ", "Zwei Kinder spielen."]
    out = nb.decode_corpus(model, tokenizer, texts, cfg, device, beam=beam)
    alone = [nb.decode_corpus(model, tokenizer, [texts[i]], cfg, device, beam=beam)[0] for i in (0, 3)]
    assert all(x.strip() for x in alone)
    assert out[1] == out[2] == ""
    assert [out[0], out[3]] == alone


@pytest.mark.parametrize("overshoot", [0, 5], ids=["as-long-as-the-table", "longer-than-the-table"])
@pytest.mark.parametrize("method", ["greedy", "beam"])
def test_decoder_refuses_source_longer_than_positions(nb, method, overshoot):
    """Before: greedy_decode and beam_search on a source as long as the positional table failed deep in the model
    with 'The size of tensor a (...) must match the size of tensor b'. Now a ValueError says it is too long."""
    torch.manual_seed(0)
    model = nb.Transformer(50, 16, 2, 32, 1, 1, 0.0, max_positions=24).eval()
    length = model.positions.size(0) + overshoot
    src = torch.randint(4, 50, (1, length))
    src[0, -1] = nb.EOS
    with pytest.raises(ValueError, match="too long"):
        if method == "greedy":
            nb.greedy_decode(model, src, 2)
        else:
            nb.beam_search(model, src, 2, 0.6, 2)


# ---------------------------------------------------------------- the Hub
@pytest.fixture
def silent_hub():
    """A TCP server on 127.0.0.1 that accepts connections and never sends a byte. It hangs up on a connection after
    SILENT_HUB_HOLD_S, so that a client without a time limit sees the connection closed (not a timeout) instead of
    hanging the suite; it is closed after the test."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.1)
    stop, held = threading.Event(), []

    def serve():
        while not stop.is_set():
            for conn, since in list(held):
                if time.monotonic() - since > SILENT_HUB_HOLD_S:
                    conn.close()
                    held.remove((conn, since))
            try:
                conn, _ = listener.accept()
            except OSError:  # the accept timeout, or the listener closed
                continue
            held.append((conn, time.monotonic()))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        for conn, _ in held:
            conn.close()
        listener.close()


LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1", None}
SILENT_HUB_HOLD_S = 120


def test_silent_hub_times_out_with_offline_advice(nb, monkeypatch, silent_hub):
    """A Hub (or proxy) that accepts the connection and never answers: load_iwslt14 probes it with the time limit
    HUB_TIMEOUT_S and raises a ConnectionError that points to TRANSFORMER_DATA_DIR, caused by that time limit (a
    TimeoutError, not the server hanging up after SILENT_HUB_HOLD_S), before `datasets` is asked at all. Only
    127.0.0.1 can be reached during the test; `datasets` is a stand-in that records being called."""
    port = silent_hub
    real_connect, real_getaddrinfo = socket.socket.connect, socket.getaddrinfo

    def local_connect(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in LOCAL_HOSTS:
            raise OSError(errno.ENETUNREACH, f"the test allows no connection to {address[0]}")
        return real_connect(self, address)

    def local_getaddrinfo(host, *args, **kwargs):
        if host not in LOCAL_HOSTS:
            raise socket.gaierror(socket.EAI_NONAME, f"the test allows no lookup of {host}")
        return real_getaddrinfo(host, *args, **kwargs)

    asked = []

    def recording_load_dataset(*args, **kwargs):
        asked.append(args)
        raise ConnectionError("the stand-in Hub does not serve data")

    monkeypatch.setattr(socket.socket, "connect", local_connect)
    monkeypatch.setattr(socket, "getaddrinfo", local_getaddrinfo)
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=recording_load_dataset))
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY",
                 "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setattr(nb, "HUB_TIMEOUT_S", 2)
    with pytest.raises(ConnectionError, match=r"did not answer within 2 s.*TRANSFORMER_DATA_DIR") as raised:
        nb.load_iwslt14()
    assert isinstance(raised.value.__cause__, TimeoutError), repr(raised.value.__cause__)
    assert asked == []


# ---------------------------------------------------------------- the preset from the environment
def test_preset_from_environment_ignores_case_and_spaces(nb, monkeypatch):
    """Before: TRANSFORMER_PRESET=' Smoke ' (a space pasted into a Colab form, a capital letter) was an 'unknown
    preset'. Now it means smoke; and an empty TRANSFORMER_PRESET means the same as none."""
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


# ---------------------------------------------------------------- the whole notebook on awkward splits
def test_whole_notebook_runs_on_tiny_splits_and_a_huge_test_sentence(tmp_path, monkeypatch):
    """Before: a data folder with a one-pair validation split and a test 'sentence' of 20,000 characters (a
    paragraph pasted as one line) broke the notebook part-way. Now every cell runs to the end and results.json is
    written."""
    data = tmp_path / "data"
    train = [(SLICE / f"train.{lang}").read_text(encoding="utf-8").split("\n")[:4000] for lang in ("de", "en")]
    write_split(data, "train", *train)
    write_split(data, "validation", *([lines[0]] for lines in train))
    write_split(data, "test", [("Ein Hund läuft. " * 1250)[:20000]], ["A dog runs."])
    work = tmp_path / "work"
    monkeypatch.setenv("TRANSFORMER_PRESET", "smoke")
    monkeypatch.setenv("TRANSFORMER_WORK_DIR", str(work))
    monkeypatch.setenv("TRANSFORMER_DATA_DIR", str(data))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    assert json.loads((work / "results.json").read_text())
