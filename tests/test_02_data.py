"""Section 2, data: reading a folder of parallel text (encodings, alignment, the folder and its files), IWSLT14
from the Hub's parquet files (read here from a local copy, under today's datasets and Colab's 4.0.0), the
Multi30k download, and the style of the text."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
from helpers import ROOT, SPLITS, lines, write_split


def numbered(n: int) -> tuple[list[str], list[str]]:
    """n ordinary sentence pairs of similar length."""
    return [f"Satz {i}" for i in range(n)], [f"sentence {i}" for i in range(n)]


def write_folder(folder: Path, train: int = 1000, validation: int = 5, test: int = 5) -> Path:
    """A well-formed data folder with the given numbers of pairs per split."""
    for split, n in (("train", train), ("validation", validation), ("test", test)):
        write_split(folder, split, *numbered(n))
    return folder


def write_sized_folder(folder: Path, sizes: dict[str, tuple[int, int]]) -> Path:
    """A data folder whose split files hold the given numbers of numbered lines: sizes[split] = (German, English)."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, (n_de, n_en) in sizes.items():
        (folder / f"{split}.de").write_text("".join(f"Satz {i}\n" for i in range(n_de)), encoding="utf-8")
        (folder / f"{split}.en").write_text("".join(f"sentence {i}\n" for i in range(n_en)), encoding="utf-8")
    return folder


def write_greetings_folder(folder: Path, n: int = 5) -> Path:
    """A well-formed data folder of n pairs per split, its German side not ASCII (Grüße)."""
    folder.mkdir(parents=True, exist_ok=True)
    for split in ("train", "validation", "test"):
        (folder / f"{split}.de").write_text("".join(f"Grüße {i}\n" for i in range(n)), encoding="utf-8")
        (folder / f"{split}.en").write_text("".join(f"Greetings {i}\n" for i in range(n)), encoding="utf-8")
    return folder


# ---------------------------------------------------------------- reading a file: encodings and whitespace (read_lines)
def test_byte_order_mark_and_trailing_whitespace_are_stripped(nb, tmp_path):
    """A byte-order mark (a file saved by Notepad begins with '\\ufeff') and trailing spaces, tabs and '\\r' are
    stripped; leading whitespace is kept."""
    folder = write_folder(tmp_path / "d", train=3)
    (folder / "train.de").write_bytes("\ufeffEin Hund läuft. \t\r\n  Zwei Katzen.\t \nDrei Vögel.\r\n".encode())
    (folder / "train.en").write_bytes("\ufeffA dog runs.\r\n  Two cats. \r\nThree birds.  \n".encode())
    corpus = nb.read_parallel_folder(folder)
    assert corpus["train"] == (["Ein Hund läuft.", "  Zwei Katzen.", "Drei Vögel."],
                               ["A dog runs.", "  Two cats.", "Three birds."])


def test_folder_lines_are_read_exactly(nb, tmp_path):
    """Split on '\\n' only: a Unicode line separator inside a sentence must not break the alignment. Leading
    whitespace stays; trailing whitespace (and a Windows '\\r') goes."""
    folder = write_sized_folder(tmp_path / "d", {"train": (2, 2), "validation": (1, 1), "test": (1, 1)})
    (folder / "train.de").write_text("a\u2028b\r\n  c \n", encoding="utf-8")
    corpus = nb.read_parallel_folder(folder)
    assert corpus["train"][0] == ["a\u2028b", "  c"]


def test_latin1_file_names_file_line_and_fix(nb, tmp_path):
    """A Latin-1 file: a ValueError names the file, the line, UTF-8, and how to convert the file."""
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
    """A UTF-16 file (Windows 'Unicode' text, with a byte-order mark): a ValueError names the file and says it is
    UTF-16."""
    folder = write_folder(tmp_path / "d", train=3)
    (folder / "validation.en").write_bytes("".join(f"sentence {i}\n" for i in range(5)).encode("utf-16"))
    with pytest.raises(ValueError) as info:
        nb.read_parallel_folder(folder)
    message = str(info.value)
    assert str((folder / "validation.en").resolve()) in message, message
    assert "UTF-16" in message, message


@pytest.mark.parametrize("encoding", ["UTF-16LE", "UTF-16BE"])
@pytest.mark.parametrize("text", ["German", "ASCII"])
def test_utf16_without_byte_order_mark_gets_the_right_iconv(nb, tmp_path, encoding, text):
    """UTF-16 without a byte-order mark, with German letters or all ASCII, is told by its pattern of NUL bytes: the
    error names the file and gives iconv -f UTF-16LE or -f UTF-16BE (never LATIN1)."""
    folder = write_greetings_folder(tmp_path / "d")
    lines = "".join(f"{'Grüße' if text == 'German' else 'Hello'} number {i}\n" for i in range(5))
    (folder / "validation.de").write_bytes(lines.encode(encoding.lower().replace("utf-16", "utf-16-")))
    with pytest.raises(ValueError) as info:
        nb.read_parallel_folder(folder)
    message = str(info.value)
    assert str((folder / "validation.de").resolve()) in message and f"iconv -f {encoding} -t UTF-8" in message, message
    assert "LATIN1" not in message


def test_utf16_converted_as_if_it_were_latin1_is_refused(nb, tmp_path):
    """A UTF-16 file passed through iconv -f LATIN1 (UTF-8 text with a NUL after every letter) is refused by the same
    check: the error names the line, UTF-16LE and says to convert the original file."""
    folder = write_greetings_folder(tmp_path / "d")
    lines = "".join(f"Grüße aus Köln, Nummer {i}\n" for i in range(5))
    (folder / "train.de").write_bytes(lines.encode("utf-16-le").decode("latin-1").encode("utf-8"))
    with pytest.raises(ValueError, match=r"line 1: not UTF-8 text \(UTF-16LE\?\).*iconv -f UTF-16LE -t UTF-8.*the original"):
        nb.read_parallel_folder(folder)


def test_a_stray_nul_byte_is_named_not_called_utf16(nb, tmp_path):
    """One NUL byte in an otherwise UTF-8 file (a stray \\0 from a broken copy) is named with its file and line and the
    fix (delete it), never called UTF-16 with an iconv command that would garble the file."""
    folder = write_greetings_folder(tmp_path / "d")
    (folder / "train.de").write_bytes("Grüße 0\nGrüße 1\nGrü\0ße 2\nGrüße 3\nGrüße 4\n".encode())
    with pytest.raises(ValueError) as info:
        nb.read_parallel_folder(folder)
    message = str(info.value)
    assert f"{(folder / 'train.de').resolve()}, line 3" in message and "NUL" in message and "delete" in message, message
    assert "UTF-16" not in message and "iconv" not in message, message


# ---------------------------------------------------------------- two files line by line (read_parallel_folder)
def test_misaligned_files_name_both_files_and_counts(nb, tmp_path):
    folder = write_sized_folder(tmp_path / "d", {"train": (3, 3), "validation": (5, 4), "test": (2, 2)})
    with pytest.raises(ValueError, match=r"validation\.de has 5 lines but .*validation\.en has 4"):
        nb.read_parallel_folder(folder)


def test_empty_split(nb, tmp_path):
    folder = write_sized_folder(tmp_path / "d", {"train": (3, 3), "validation": (2, 2), "test": (0, 0)})
    with pytest.raises(ValueError, match=r"test\.de and .*test\.en are empty"):
        nb.read_parallel_folder(folder)


def test_pairs_empty_on_both_sides_are_dropped(nb, tmp_path):
    """Pairs blank on both sides (a trailing blank paragraph, a double newline) are dropped, and the rest stays
    aligned."""
    de, en = numbered(10)
    for i in (2, 6):  # 0-based: lines 3 and 7 blank in both files
        de[i] = en[i] = ""
    write_split(tmp_path / "d", "train", de, en)
    write_split(tmp_path / "d", "validation", *numbered(3))
    write_split(tmp_path / "d", "test", *numbered(3))
    corpus = nb.read_parallel_folder(tmp_path / "d")
    keep = [i for i in range(10) if i not in (2, 6)]
    assert corpus["train"] == ([f"Satz {i}" for i in keep], [f"sentence {i}" for i in keep])
    assert corpus["validation"] == numbered(3)


@pytest.mark.parametrize("case", ["shifted", "one blank"])
def test_line_empty_on_one_side_names_file_and_line(nb, tmp_path, case):
    """A line blank on one side only raises a ValueError naming the file with the blank line and its 1-based line
    number, also when a blank line inserted in one file and another removed elsewhere keep the line counts equal
    (the pairs in between shifted)."""
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


# ---------------------------------------------------------------- the folder itself (read_parallel_folder)
def test_missing_data_folder(nb, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"does not exist: TRANSFORMER_DATA_DIR must name a folder"):
        nb.read_parallel_folder(tmp_path / "nowhere")


def test_data_dir_that_is_a_file(nb, tmp_path):
    """TRANSFORMER_DATA_DIR naming a file: a NotADirectoryError says that TRANSFORMER_DATA_DIR is a file."""
    path = tmp_path / "corpus.tsv"
    path.write_text("Ein Hund.\tA dog.\n", encoding="utf-8")
    with pytest.raises(NotADirectoryError) as info:
        nb.read_parallel_folder(path)
    assert "TRANSFORMER_DATA_DIR" in str(info.value) and "is a file" in str(info.value), str(info.value)


def test_missing_relative_folder_names_the_absolute_path(nb, tmp_path, monkeypatch):
    """A relative TRANSFORMER_DATA_DIR that does not exist: the FileNotFoundError names the absolute path it looked
    in, so that the working directory need not be guessed."""
    monkeypatch.chdir(tmp_path)
    relative = Path("data") / "de-en"
    with pytest.raises(FileNotFoundError) as info:
        nb.read_parallel_folder(relative)
    assert str(relative.resolve()) in str(info.value), str(info.value)


def test_missing_split_file(nb, tmp_path):
    folder = write_sized_folder(tmp_path / "d", {"train": (3, 3), "validation": (2, 2)})
    with pytest.raises(FileNotFoundError, match=r"test\.de is missing"):
        nb.read_parallel_folder(folder)


def test_split_file_that_is_a_folder(nb, tmp_path):
    """A folder named train.de: an IsADirectoryError names it and says it is a folder."""
    folder = write_folder(tmp_path / "d")
    (folder / "train.de").unlink()
    (folder / "train.de").mkdir()
    with pytest.raises(IsADirectoryError) as info:
        nb.read_parallel_folder(folder)
    message = str(info.value)
    assert str((folder / "train.de").resolve()) in message and "is a folder" in message, message


def test_one_pair_evaluation_splits_are_read(nb, tmp_path):
    """Validation and test splits of one pair each are accepted."""
    corpus = nb.read_parallel_folder(write_folder(tmp_path / "small", train=50, validation=1, test=1))
    assert corpus["validation"] == (["Satz 0"], ["sentence 0"]) and corpus["test"] == (["Satz 0"], ["sentence 0"])
    assert len(corpus["train"][0]) == 50


# ---------------------------------------------------------------- IWSLT14 from the Hub (load_iwslt14)
def test_unreachable_hub_explains_offline_use(nb, monkeypatch):
    """IWSLT14's files cannot be read from the Hub: a ConnectionError names the Hub and TRANSFORMER_DATA_DIR."""
    def refuse(*args, **kwargs):
        raise ConnectionError("no route to huggingface.co")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=refuse))
    with pytest.raises(ConnectionError, match=r"Hugging Face Hub.*TRANSFORMER_DATA_DIR"):
        nb.load_iwslt14()


def test_iwslt14_is_read_from_the_hubs_parquet_files(nb, monkeypatch):
    """The Hub's three parquet files are read by URL; rows become (de, en) lines."""
    calls = []

    def load_dataset(path, data_files=None):
        calls.append((path, data_files))
        return {split: {"translation": [{"de": f"{split} de", "en": f"{split} en"}]} for split in data_files}

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    corpus = nb.load_iwslt14()
    assert calls[0][0] == "parquet"
    assert calls[0][1]["test"] == ("https://huggingface.co/datasets/bbaaaa/iwslt14-de-en/resolve/refs%2Fconvert%2Fparquet"
                                   "/de-en/test/0000.parquet")
    assert corpus["validation"] == (["validation de"], ["validation en"])


# ---------------------------------------------------------------- IWSLT14 in the Hub's parquet layout, read locally
DATASETS_4 = ROOT / ".deps" / "datasets-4.0.0"  # filled by .ci/run from tests/requirements-datasets4.txt
DATASETS_4_INSTALL = ("python -m pip install -q --no-deps --upgrade --target .deps/datasets-4.0.0 "
                      "-r tests/requirements-datasets4.txt")


def write_hub_layout(root: Path) -> Path:
    """The slice's Hub text as the Hub's parquet conversion lays it out: root/de-en/{split}/0000.parquet, one column
    `translation` = {"de": ..., "en": ...}."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for split in SPLITS:
        rows = [{"de": de, "en": en} for de, en in zip(lines("hub", split, "de"), lines("hub", split, "en"))]
        (root / "de-en" / split).mkdir(parents=True)
        pq.write_table(pa.table({"translation": rows}), root / "de-en" / split / "0000.parquet")
    return root


@pytest.fixture
def datasets_cache(tmp_path, monkeypatch):
    """datasets' cache in tmp_path, not in the home folder."""
    import datasets.config

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")


def test_iwslt14_loader_reads_the_hubs_layout(nb, tmp_path, monkeypatch, datasets_cache):
    """load_iwslt14 reads the Hub's three parquet files (here a local copy in the Hub's layout, by the same code), and
    load_corpus reads IWSLT14 from the Hub when no data folder is given."""
    monkeypatch.setattr(nb, "IWSLT14_PARQUET", str(write_hub_layout(tmp_path / "hub")))
    want = {split: (lines("hub", split, "de"), lines("hub", split, "en")) for split in SPLITS}
    assert nb.load_iwslt14() == want
    assert nb.load_iwslt14("en", "de")["test"] == want["test"][::-1]
    corpus = nb.load_corpus(dataclasses.replace(nb.make_config("smoke"), dataset="iwslt14", data_dir=None))
    assert corpus == want  # max_train_pairs (4,000) keeps all 300


DATASETS_4_SCRIPT = """
import json, sys
from nbloader import load_notebook, notebook_environment
import datasets
with notebook_environment("smoke", sys.argv[2], sys.argv[3]):
    m = load_notebook("sections_0_to_2", until="## 3.")  # config and data: the loader as the notebook defines it
m.IWSLT14_PARQUET = sys.argv[1]  # a local copy in the Hub's layout, read by the same code
first = m.load_iwslt14()
print(json.dumps({"version": datasets.__version__, "first": first}))
"""


@pytest.mark.skipif(not DATASETS_4.is_dir() and not os.environ.get("CI"), reason=f"datasets 4.0.0 (Colab's) is not installed in {DATASETS_4}: "
                    f"`bash .ci/run` installs it; by hand: {DATASETS_4_INSTALL}")
def test_iwslt14_loader_reads_the_hubs_layout_with_datasets_4(tmp_path):
    """The same under Colab's datasets 4.0.0, in a subprocess with it first on the path (seconds). Under CI (`CI`
    set) it runs whether or not the folder is there, so that CI never skips it silently."""
    root = write_hub_layout(tmp_path / "hub")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(DATASETS_4), str(ROOT / "tests")]),
           "HF_HOME": str(tmp_path / "hf")}
    result = subprocess.run([sys.executable, "-c", DATASETS_4_SCRIPT, str(root), str(tmp_path / "work"),
                             str(ROOT / "tests" / "data" / "multi30k")], check=False, capture_output=True, text=True,
                            env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert loaded["version"] == "4.0.0"
    want = {split: [lines("hub", split, "de"), lines("hub", split, "en")] for split in SPLITS}
    assert loaded["first"] == want


# ---------------------------------------------------------------- the Multi30k download
def test_multi30k_download_writes_the_six_files_once(nb, tmp_path, monkeypatch):
    import gzip

    fetched = []

    def fake_urlopen(url, timeout):
        fetched.append(url)
        lang = url.split(".")[-2]
        return io.BytesIO(gzip.compress(f"{lang} one\n{lang} two\n".encode()))

    monkeypatch.setattr(nb.urllib.request, "urlopen", fake_urlopen)
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


# ---------------------------------------------------------------- the style of the text (text_style)
def test_text_style_names_the_kind_of_bleu(nb):
    iwslt_like = ["it 's a great idea , and we 'll see .", "i do n't know what &apos;s going on ."] * 50
    assert nb.text_style(iwslt_like) == "lowercased, tokenized"
    assert nb.text_style(nb.corpus["test"][1]) == "cased, detokenized"
    assert nb.text_style([line.lower() for line in nb.corpus["test"][1]]) == "lowercased, detokenized"


def test_text_style_names_each_iwslt14_style(nb):
    """The Hub's text is lowercased and detokenized, fairseq's is lowercased and tokenized: on every split and both
    languages, and so the headline BLEU is 13a on the one and whitespace tokens on the other."""
    for split in SPLITS:
        for lang in ("de", "en"):
            assert nb.text_style(lines("hub", split, lang)) == "lowercased, detokenized", (split, lang)
            assert nb.text_style(lines("tokenized", split, lang)) == "lowercased, tokenized", (split, lang)
    assert nb.headline_tokenize(nb.text_style(lines("hub", "test", "en"))) == "13a"
    assert nb.headline_tokenize(nb.text_style(lines("tokenized", "test", "en"))) == "none"
