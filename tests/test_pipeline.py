"""The data pipeline and the paper's settings: the default preset's values, how decoding uses them, the shared BPE
vocabulary, encode_corpus, and reuse of a saved tokenizer.

Everything runs on the CPU against the notebook's own definitions (the `nb` fixture of conftest.py).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
from collections import Counter

import pytest
import torch

CPU = torch.device("cpu")


# ---------------------------------------------------------------------------------------------------------------------
# 1. the paper's settings in the default preset, and decoding that uses them


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


def test_changed_settings_get_their_own_work_folder(nb, clean_environment):
    """With no TRANSFORMER_WORK_DIR, the work folder is named after the preset and a hash of the settings a
    checkpoint must match: editing PRESETS and re-running starts a fresh run instead of a fingerprint error, and
    the same settings find their checkpoint again."""
    base = nb.make_config("smoke")
    assert base.work_dir.startswith("runs/smoke-") and nb.make_config("smoke").work_dir == base.work_dir
    assert nb.make_config("smoke", d_model=32).work_dir != base.work_dir
    assert nb.make_config("smoke", epochs=20).work_dir == base.work_dir  # training longer resumes


def test_no_preset_drops_attention_weights(nb, clean_environment):
    """Dropout goes on sub-layer outputs and embedding + position sums only (paper §5.4): every preset keeps
    attention_dropout at 0.0."""
    for preset in nb.PRESETS:
        assert nb.make_config(preset).attention_dropout == 0.0, preset


def bound_arguments(function, args, kwargs) -> dict:
    """The arguments of one call by parameter name, defaults filled in: positional or keyword makes no difference."""
    bound = inspect.signature(function).bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


@pytest.fixture
def decoder_spies(nb, monkeypatch):
    """Replace beam_search and greedy_decode with spies that record their arguments and return empty outputs."""
    calls = {"beam_search": [], "greedy_decode": []}
    for name in calls:
        real = getattr(nb, name)

        def spy(*args, _name=name, _real=real, **kwargs):
            arguments = bound_arguments(_real, args, kwargs)
            calls[_name].append(arguments)
            return [[] for _ in range(arguments["src"].size(0))]

        monkeypatch.setattr(nb, name, spy)
    return calls


def test_decode_corpus_passes_the_configured_beam_settings(nb, decoder_spies):
    """Beam search gets the beam size asked for, cfg.length_penalty and cfg.max_extra_len (values unlike the
    functions' defaults, so a forgotten argument shows); greedy decoding gets cfg.max_extra_len."""
    cfg = nb.make_config("smoke", length_penalty=0.37, max_extra_len=7)
    texts = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee."]
    assert nb.decode_corpus(nb.model, nb.tokenizer, texts, cfg, CPU, beam=3) == ["", ""]
    (call,) = decoder_spies["beam_search"]
    assert (call["beam"], call["alpha"], call["max_extra"]) == (3, 0.37, 7)
    assert call["src"].size(0) == 2 and not decoder_spies["greedy_decode"]

    nb.decode_corpus(nb.model, nb.tokenizer, texts, cfg, CPU, beam=1)
    (call,) = decoder_spies["greedy_decode"]
    assert call["max_extra"] == 7 and len(decoder_spies["beam_search"]) == 1


def test_translate_uses_the_configured_beam_size(nb, decoder_spies):
    """translate() takes model, tokenizer and config as arguments (no notebook globals): beam None means
    cfg.beam_size, with cfg's length penalty and length limit; beam=1 is greedy."""
    cfg = dataclasses.replace(nb.cfg, beam_size=3, length_penalty=0.37, max_extra_len=7)
    nb.translate("Ein Mann fährt Fahrrad.", nb.model, nb.tokenizer, cfg, CPU)
    (call,) = decoder_spies["beam_search"]
    assert (call["beam"], call["alpha"], call["max_extra"]) == (3, 0.37, 7)
    nb.translate("Ein Mann fährt Fahrrad.", nb.model, nb.tokenizer, cfg, CPU, beam=1)
    assert len(decoder_spies["greedy_decode"]) == 1


def test_translate_brings_typed_text_to_the_training_style(nb, decoder_spies, monkeypatch):
    """For a model trained on lowercased, tokenized text (IWSLT14 as fairseq prepares it), translate() lowercases
    the input and splits its punctuation before encoding, and detokenizes the output for display; for cased,
    detokenized training text it passes both through unchanged."""
    seen = []
    real_encode = nb.tokenizer.encode
    monkeypatch.setattr(nb.tokenizer, "encode", lambda text: seen.append(text) or real_encode(text), raising=False)
    nb.translate("Das ist's, sagte er.", nb.model, nb.tokenizer, nb.cfg, CPU, style="lowercased, tokenized")
    assert seen[-1] == "das ist &apos; s , sagte er ."  # German: the Moses tokenizer splits "'" on both sides
    nb.translate("Das ist's, sagte er.", nb.model, nb.tokenizer, nb.cfg, CPU, style="cased, detokenized")
    assert seen[-1] == "Das ist's, sagte er."
    assert nb.for_display("it &apos;s a test , isn &apos;t it ?", "lowercased, tokenized") == "it's a test, isn't it?"
    assert nb.for_display("a , b", "cased, detokenized") == "a , b"


# ---------------------------------------------------------------------------------------------------------------------
# 2. one BPE vocabulary for both languages


# frequent words of the smoke training data (Multi30k), German and English, as they occur inside a sentence
GERMAN_WORDS = [" Mann", " und", " ein", " einem", " mit", " der", " die", " Frau", " Hund"]
ENGLISH_WORDS = [" the", " a", " man", " and", " with", " of", " woman", " dog"]


@pytest.mark.parametrize("word", GERMAN_WORDS + ENGLISH_WORDS + ["Ein", "A"])
def test_frequent_words_of_both_languages_are_single_tokens(nb, word):
    """The vocabulary is learnt from German and English together (one matrix embeds both, paper §3.4): the frequent
    words of either language are whole tokens, not pieces."""
    lang = "de" if word in GERMAN_WORDS or word == "Ein" else "en"
    lines = nb.corpus["train"][0 if lang == "de" else 1]
    assert sum(f"{word} " in f" {line} " for line in lines) >= 100, "not a frequent word: the test proves nothing"
    encoding = nb.tokenizer.encode(word)
    assert len(encoding.ids) == 1, encoding.tokens
    assert nb.tokenizer.decode(encoding.ids) == word


def test_vocabulary_holds_both_languages_in_proportion(nb):
    """Of the whole-word tokens (a leading space and 3+ letters) most frequent in each language's training text, a
    good share are in the vocabulary for both: neither language was left out or starved."""
    vocab = nb.tokenizer.get_vocab()
    for lines in nb.corpus["train"]:
        words = Counter(word for line in lines for word in line.split()[1:] if word.isascii() and word.isalpha() and len(word) >= 3)
        top = [word for word, _ in words.most_common(50)]
        whole = [word for word in top if "Ġ" + word in vocab]
        assert len(whole) >= 40, sorted(set(top) - set(whole))


# ---------------------------------------------------------------------------------------------------------------------
# 3. encode_corpus


def lengthen_by_one_token(nb, text: str) -> str:
    """`text` with something appended that costs exactly one more token."""
    n = len(nb.tokenizer.encode(text).ids)
    for suffix in ("!", "?", ",", " A", " X", "x"):
        if len(nb.tokenizer.encode(text + suffix).ids) == n + 1:
            return text + suffix
    raise AssertionError(f"no one-token suffix found for {text!r}")


def test_encode_corpus_formats_and_filters(nb):
    """Sources are ids + [EOS] (no <bos>), targets [BOS] + ids + [EOS]. A training pair is kept when the source
    has at most max_len tokens and the target at most max_len + 1 (its <bos> is input only); longer training
    pairs are dropped, while validation and test keep every pair, in order."""
    tok = nb.tokenizer
    base = "Ein Mann und ein Hund spielen im Park."
    n = len(tok.encode(base).ids)
    max_len = n + 1  # base + <eos> as a source, <bos> base <eos> as a target: exactly at the limit
    longer = lengthen_by_one_token(nb, base)
    long_text = "Ein Mann und eine Frau sitzen mit einem Hund auf einer Bank in der Stadt. " * 3
    train = [("Ein Mann.", "A man.", True),
             (base, base, True),  # both exactly at their limit
             (longer, "A dog.", False),  # the source one token over
             ("Ein Hund.", longer, False),  # the target one token over
             (long_text, "Two dogs.", False),
             ("Zwei Hunde.", long_text, False),
             ("Eine Frau.", "A woman.", True)]
    held_out = [("Ein Hund.", "A dog."), (long_text, long_text), (base, longer)]
    corpus = {"train": ([p[0] for p in train], [p[1] for p in train]),
              "validation": ([p[0] for p in held_out], [p[1] for p in held_out]),
              "test": ([p[0] for p in held_out[::-1]], [p[1] for p in held_out[::-1]])}
    data = nb.encode_corpus(tok, corpus, max_len)

    def expected(pairs):
        return ([tok.encode(de).ids + [nb.EOS] for de, _ in pairs],
                [[nb.BOS] + tok.encode(en).ids + [nb.EOS] for _, en in pairs])

    kept = [(de, en) for de, en, keep in train if keep]
    assert data["train"] == expected(kept)
    assert data["validation"] == expected(held_out)
    assert data["test"] == expected(held_out[::-1])
    src, tgt = data["train"]
    assert max(map(len, src)) == max_len and max(map(len, tgt)) == max_len + 1  # the limits are inclusive
    for ids in data["validation"][0] + data["test"][0]:
        assert ids[-1] == nb.EOS and nb.BOS not in ids and nb.EOS not in ids[:-1]
    assert max(map(len, data["validation"][1])) > 3 * max_len  # long pairs were there to be dropped


def test_held_out_pairs_longer_than_the_positional_table_leave_the_loss_only(nb, capsys):
    """A validation pair longer than the positional table used to crash validation_loss at every epoch end (and on
    every resume). encode_corpus leaves it out of validation/test ids (saying so), and the loss runs; the text
    itself stays in the corpus for BLEU, where decode_corpus truncates it."""
    tok = nb.tokenizer
    huge = "Ein Hund läuft durch den Schnee. " * 300
    assert len(tok.encode(huge).ids) > 1024
    corpus = {split: (["Ein Hund.", huge, "Eine Frau."], ["A dog.", "A dog.", "A woman."]) for split in nb.SPLITS}
    data = nb.encode_corpus(tok, corpus, max_len=64, max_positions=1024)
    assert "validation: 1 pair(s) longer than the 1024-position table left out" in capsys.readouterr().out
    assert data["validation"][0] == [tok.encode(t).ids + [nb.EOS] for t in ("Ein Hund.", "Eine Frau.")]
    cfg = nb.make_config("smoke")
    model = nb.build_model(cfg, nb.VOCAB)
    loss, nll = nb.validation_loss(model, nb.make_batches(*data["validation"], 4096), torch.device("cpu"), 0.1)
    assert math.isfinite(loss) and math.isfinite(nll)


# ---------------------------------------------------------------------------------------------------------------------
# 4. a saved tokenizer is reused for the same data and vocabulary size only


def small_corpus(nb, n: int = 300) -> dict:
    return {split: tuple(lines[:n] for lines in nb.corpus[split]) for split in nb.SPLITS}


def test_saved_tokenizer_is_reused_only_for_the_same_data_and_size(nb, tmp_path, monkeypatch):
    cfg = dataclasses.replace(nb.cfg, work_dir=str(tmp_path), vocab_size=300)
    corpus = small_corpus(nb)
    real, trained = nb.train_bpe, []

    def counting_train_bpe(texts, vocab_size):
        trained.append(vocab_size)
        return real(texts, vocab_size)

    monkeypatch.setattr(nb, "train_bpe", counting_train_bpe)
    first = nb.load_or_train_bpe(cfg, corpus)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert trained == [300] and len(files) == 1 and files[0].startswith("bpe-300-")

    def refuse(texts, vocab_size):
        raise AssertionError("the saved tokenizer should have been reused")

    monkeypatch.setattr(nb, "train_bpe", refuse)
    again = nb.load_or_train_bpe(cfg, corpus)
    assert again.get_vocab() == first.get_vocab()
    assert nb.PAD not in again.encode("<pad>").ids  # the literal-specials setting is not in the file: re-applied

    monkeypatch.setattr(nb, "train_bpe", counting_train_bpe)
    other_data = {**corpus, "train": (["Ganz andere Daten."] + corpus["train"][0][1:], corpus["train"][1])}
    nb.load_or_train_bpe(cfg, other_data)
    bigger = nb.load_or_train_bpe(dataclasses.replace(cfg, vocab_size=320), corpus)
    assert trained == [300, 300, 320]
    assert bigger.get_vocab_size() == 320
    names = sorted(p.name for p in tmp_path.iterdir())
    assert len(names) == 3 and files[0] in names and not any(name.endswith(".tmp") for name in names)


def test_corpus_fingerprint_sees_a_change_anywhere(nb):
    """Any edited line of any split, or a swapped pair of lines, gives another fingerprint (so no stale tokenizer or
    checkpoint is reused), and the same text always gives the same one."""
    corpus = small_corpus(nb, 50)
    base = nb.corpus_fingerprint(corpus)
    assert nb.corpus_fingerprint(small_corpus(nb, 50)) == base
    for split in nb.SPLITS:
        for side in (0, 1):
            for index in (1, 17, 48):
                edited = {k: tuple(list(v) for v in pair) for k, pair in corpus.items()}
                edited[split][side][index] += " x"
                assert nb.corpus_fingerprint(edited) != base, (split, side, index)
    swapped = {k: tuple(list(v) for v in pair) for k, pair in corpus.items()}
    lines = swapped["train"][1]
    lines[3], lines[4] = lines[4], lines[3]
    assert nb.corpus_fingerprint(swapped) != base
