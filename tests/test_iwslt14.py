"""IWSLT14 as it really is, on the slice in tests/data/iwslt14: hub/ is the Hub's text (lowercased, detokenized),
tokenized/ is fairseq's (lowercased, Moses-tokenized), line i of one being line i of the other. The style check, the
smoke pipeline on each style, translate()'s input and output, and the parquet loader under datasets of today and 4.0.0."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

ROOT = Path(__file__).resolve().parent.parent
SLICE = ROOT / "tests" / "data" / "iwslt14"
SPLITS = ("train", "validation", "test")
DATASETS_4 = ROOT / ".deps" / "datasets-4.0.0"  # filled by .ci/run from tests/requirements-datasets4.txt
DATASETS_4_INSTALL = ("python -m pip install -q --no-deps --upgrade --target .deps/datasets-4.0.0 "
                      "-r tests/requirements-datasets4.txt")


def lines(style: str, split: str, lang: str) -> list[str]:
    return (SLICE / style / f"{split}.{lang}").read_text(encoding="utf-8").split("\n")[:-1]


def every_line(style: str, lang: str) -> list[str]:
    return [line for split in SPLITS for line in lines(style, split, lang)]


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


# ---------------------------------------------------------------------------------------------- the style of the text
def test_text_style_names_each_iwslt14_style(nb):
    """The Hub's text is lowercased and detokenized, fairseq's is lowercased and tokenized: on every split and both
    languages, and so the headline BLEU is 13a on the one and whitespace tokens on the other."""
    for split in SPLITS:
        for lang in ("de", "en"):
            assert nb.text_style(lines("hub", split, lang)) == "lowercased, detokenized", (split, lang)
            assert nb.text_style(lines("tokenized", split, lang)) == "lowercased, tokenized", (split, lang)
    assert nb.headline_tokenize(nb.text_style(lines("hub", "test", "en"))) == "13a"
    assert nb.headline_tokenize(nb.text_style(lines("tokenized", "test", "en"))) == "none"


# ---------------------------------------------------------------------------------- translate()'s input and output
def test_typed_german_is_tokenized_as_fairseqs_german(nb):
    """Before: to_training_style split every symbol and every "'" the English way, but left '"' and '[' unescaped,
    split numbers (1.000 -> 1 . 000) and abbreviations (z.b., dr.): 87-90 % of the slice's German lines came out as
    fairseq's tokenizer wrote them. Now the Moses tokenizer's main rules for German: at least 97 % (99.7 % counted
    on all 18,633 lines of shared/data/iwslt14)."""
    hub, tokenized = every_line("hub", "de"), every_line("tokenized", "de")
    same = sum(nb.to_training_style(h, "lowercased, tokenized") == t for h, t in zip(hub, tokenized))
    assert same >= 0.97 * len(hub), f"{same} of {len(hub)}"
    english = sum(nb.to_training_style(h, "lowercased, tokenized", "en") == t
                  for h, t in zip(every_line("hub", "en"), every_line("tokenized", "en")))
    assert english >= 0.97 * len(hub), f"English: {english} of {len(hub)}"  # "it 's", not "it ' s"
    assert all(nb.to_training_style(h, "lowercased, detokenized") == h for h in hub)  # the Hub's style: as it is
    assert nb.to_training_style("Zwei Kinder, z. B. im Park.", "lowercased, detokenized") == "zwei kinder, z. b. im park."


def test_tokenized_english_is_displayed_as_the_hub_writes_it(nb):
    """Before: for_display left '" a "' with its spaces, '20 %' and '&#91;' as they were: 91-95 % of the slice's
    English lines matched the Hub's detokenized line. Now at least 97 %, and the rest differ only in spaces (around
    a lone single quote, where the Moses detokenizer guesses)."""
    tokenized, hub = every_line("tokenized", "en"), every_line("hub", "en")
    shown = [nb.for_display(t, "lowercased, tokenized") for t in tokenized]
    assert sum(s == h for s, h in zip(shown, hub)) >= 0.97 * len(hub)
    assert all(s.replace(" ", "") == h.replace(" ", "") for s, h in zip(shown, hub))
    assert all(nb.for_display(h, "lowercased, detokenized") == h for h in hub)  # the Hub's style: shown as it is


@pytest.mark.parametrize("style", ["hub", "tokenized"])
def test_translate_prepares_real_input_and_shows_real_output(nb, monkeypatch, style):
    """translate() on every German line of the slice, with a stand-in model that answers with the slice's English
    line of the same pair in the training style: the model must be asked the German line as the training text
    writes it, and the reader must be shown the English line as the Hub writes it."""
    german, english = every_line(style, "de"), every_line(style, "en")
    answers, asked = dict(zip(german, english)), []
    monkeypatch.setattr(nb, "decode_corpus", lambda model, tok, texts, cfg, device, beam: asked.extend(texts)
                        or [answers.get(texts[0], "")])
    training_style = nb.text_style(english)
    shown = [nb.translate(line, None, None, nb.cfg, "cpu", style=training_style) for line in every_line("hub", "de")]
    assert sum(a == g for a, g in zip(asked, german)) >= 0.97 * len(german)
    assert sum(s == h for s, h in zip(shown, every_line("hub", "en"))) >= 0.95 * len(german)


# -------------------------------------------------------------------------- the loader, on the Hub's parquet layout
def test_iwslt14_loader_reads_the_hubs_layout(nb, tmp_path, monkeypatch, datasets_cache):
    """load_iwslt14 reads a local folder in the Hub's layout by the code that reads the Hub (without asking the
    Hub), by either of its two routes, and load_corpus finds such a folder through TRANSFORMER_DATA_DIR."""
    root = write_hub_layout(tmp_path / "hub")
    monkeypatch.setattr(nb, "check_hub", lambda: pytest.fail("a local folder must not probe the Hub"))
    want = {split: (lines("hub", split, "de"), lines("hub", split, "en")) for split in SPLITS}
    assert nb.load_iwslt14(root=root) == want
    assert nb.load_iwslt14("en", "de", root=root)["test"] == want["test"][::-1]

    import datasets

    real_load = datasets.load_dataset

    def only_the_files(path, **options):  # the first route refused: the three files read by name
        if path != "parquet":
            raise ValueError("refused by the test")
        return real_load(path, **options)

    monkeypatch.setattr(datasets, "load_dataset", only_the_files)
    assert nb.load_iwslt14(root=str(root)) == want
    monkeypatch.setattr(datasets, "load_dataset", real_load)
    corpus = nb.load_corpus(nb.make_config("smoke", data_dir=str(root)))
    assert corpus == want  # max_train_pairs (4,000) keeps all 300


def test_iwslt14_loader_names_a_missing_file(nb, tmp_path):
    root = write_hub_layout(tmp_path / "hub")
    (root / "de-en" / "test" / "0000.parquet").unlink()
    with pytest.raises(FileNotFoundError, match=r"de-en/test/0000\.parquet"):
        nb.load_iwslt14(root=root)


DATASETS_4_SCRIPT = """
import json, sys
from nbloader import load_notebook, notebook_environment
import datasets
with notebook_environment("smoke", sys.argv[2], sys.argv[3]):
    m = load_notebook("sections_0_to_2", until="## 3.")  # config and data: the loader as the notebook defines it
first = m.load_iwslt14(root=sys.argv[1])
real_load = datasets.load_dataset
def only_the_files(path, **options):
    if path != "parquet":
        raise ValueError("refused by the test")
    return real_load(path, **options)
datasets.load_dataset = only_the_files
second = m.load_iwslt14(root=sys.argv[1])
print(json.dumps({"version": datasets.__version__, "first": first, "second": second}))
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
    assert loaded["first"] == want and loaded["second"] == want


# ------------------------------------------------------------------------------ the smoke pipeline, on each style
SHRUNK = {"epochs": 2, "warmup_steps": 8, "max_eval_sentences": 40, "max_extra_len": 10}  # seconds, not minutes


def run_pipeline(data_dir: Path, work: Path) -> types.ModuleType:
    """The notebook's pipeline on `data_dir` with the smoke preset: its cells (without the slow ones) build the
    data, the vocabulary and the batches; then what the slow cells call: train(), evaluate() and translate(), with
    the config shrunk. The module gets the `evaluation`."""
    from nbloader import load_notebook, notebook_environment

    name = f"iwslt14_smoke_{data_dir.name}"
    try:
        with notebook_environment("smoke", work, data_dir):
            m = load_notebook(name)
            cfg = dataclasses.replace(m.cfg, **SHRUNK)
            m.seed_everything(cfg.seed)
            model = m.build_model(cfg, m.VOCAB)
            state = m.train(model, m.train_batches, m.valid_batches, cfg, m.device,
                            m.model_fingerprint(cfg, m.corpus_fingerprint(m.corpus)))
            assert state.epoch == SHRUNK["epochs"], state
            last = {k: v.detach().clone() for k, v in model.state_dict().items()}
            m.evaluation = m.evaluate(model, last, m.corpus, m.tokenizer, cfg, m.device, m.STYLE)
            for sentence in ["Ein Mann fährt mit dem Fahrrad durch die Stadt.", *m.corpus["test"][0][:3]]:
                print(f"{sentence}\n  -> {m.translate(sentence, model, m.tokenizer, cfg, m.device, style=m.STYLE)}")
    finally:
        sys.modules.pop(name, None)
        plt.close("all")
    return m


@pytest.mark.filterwarnings("ignore:300 training pairs are too small")
@pytest.mark.parametrize("style, headline", [("hub", "13a"), ("tokenized", "none")])
def test_smoke_pipeline_on_real_iwslt14(style, headline, tmp_path, capsys):
    """The notebook's pipeline on the slice (14 steps, 40 sentences scored): it finds the style, scores with the
    right headline (13a on the Hub's text; whitespace tokens on fairseq's, with 13a beside) and names it, and
    translate() shows its outputs without Moses escapes."""
    module = run_pipeline(SLICE / style, tmp_path / "work")
    out = capsys.readouterr().out
    found = "lowercased, detokenized" if style == "hub" else "lowercased, tokenized"
    assert f"reference text: {found}" in out
    assert module.corpus["test"] == (lines(style, "test", "de"), lines(style, "test", "en"))
    assert module.STYLE == found and module.evaluation["tokenize"] == headline
    scores = re.findall(rf"BLEU = +\d+\.\d+(?: \(13a: +\d+\.\d+\))? on 40 test sentences \({found} references\)", out)
    results = json.loads((tmp_path / "work" / "results.json").read_text())
    assert len(scores) == len(results["bleu"]) >= 4, out[-3000:]  # the last weights and an average, greedy and beam
    assert results["style"] == found and f"|tok:{headline}|" in results["signature"]
    shown = re.findall(r"\n  -> (.*)", out)  # translate()'s outputs
    assert len(shown) >= 3 and not any(re.search(r"&(apos|quot|amp|#91|#93);", line) for line in shown), shown
    if headline == "none":
        assert all("(13a: " in score for score in scores)
        assert re.search(r"13a signature: +nrefs:1\|case:mixed\|eff:no\|tok:13a\|", out)
    else:
        assert "(13a: " not in out and "13a signature" not in out
