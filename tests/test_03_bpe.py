"""Section 3, one shared byte-level BPE vocabulary: what the tokenizer learns and round-trips, the saved tokenizer
and when it is reused, and encode_corpus."""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter

import pytest
import torch
from helpers import SLICE, truncate_to_half


def small_corpus(nb, n: int = 300) -> dict:
    return {split: tuple(lines[:n] for lines in nb.corpus[split]) for split in nb.SPLITS}


def lengthen_by_one_token(nb, text: str) -> str:
    """`text` with something appended that costs exactly one more token."""
    n = len(nb.tokenizer.encode(text).ids)
    for suffix in ("!", "?", ",", " A", " X", "x"):
        if len(nb.tokenizer.encode(text + suffix).ids) == n + 1:
            return text + suffix
    raise AssertionError(f"no one-token suffix found for {text!r}")


# ---------------------------------------------------------------- the byte-level BPE (train_bpe)
def test_fresh_byte_level_bpe_round_trips_unseen_characters(nb):
    tokenizer = nb.train_bpe(["Ein Mann fährt Fahrrad.", "A man rides a bike.", "Zwei Hunde spielen im Schnee."] * 5,
                             300)
    assert [tokenizer.token_to_id(t) for t in nb.SPECIALS] == [nb.PAD, nb.BOS, nb.EOS, nb.UNK]
    for text in ["Straße", "Grüße aus Köln 😀🚲", "中文 和 日本語", "naïve café — «quotes» “curly”", "Ελληνικά, русский",
                 "  two  spaces\tand a tab ", "\u00a0nbsp and \u2028 a line separator", "x" * 300, "", "ẞ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢"]:
        ids = tokenizer.encode(text).ids
        assert nb.UNK not in ids, text
        assert tokenizer.decode(ids) == text


def test_special_tokens_written_in_the_text_are_ordinary_text(nb, tmp_path):
    """A sentence containing "<pad>" or "<eos>" must not get padding or end-of-sentence ids (masks would cut it): so
    says load_or_train_bpe, the one place the setting is made (the file does not keep it), of a tokenizer it trains
    and of one it reads back."""
    cfg = dataclasses.replace(nb.cfg, work_dir=str(tmp_path))
    trained, reused = nb.load_or_train_bpe(cfg, nb.corpus), nb.load_or_train_bpe(cfg, nb.corpus)  # the second from file
    text = "ein <pad> und <eos> oder <bos>, <unk>"
    for tokenizer in (nb.tokenizer, trained, reused):
        ids = tokenizer.encode(text).ids
        assert not set(ids) & {nb.PAD, nb.BOS, nb.EOS, nb.UNK}, ids
        assert tokenizer.decode(ids) == text


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


@pytest.mark.parametrize("lang", ["de", "en"])
def test_tokenizer_round_trips_every_test_line(nb, lang):
    lines = (SLICE / f"test.{lang}").read_text(encoding="utf-8").split("\n")
    lines = lines[:-1] if lines[-1] == "" else lines
    assert len(lines) == 1000
    encodings = nb.tokenizer.encode_batch(lines)
    bad = [line for line, e in zip(lines, encodings) if nb.tokenizer.decode(e.ids) != line]
    assert not bad, f"{len(bad)} lines do not round-trip, e.g. {bad[:3]}"
    assert all(nb.UNK not in e.ids for e in encodings)


# ---------------------------------------------------------------- the saved tokenizer (corpus_fingerprint, load_or_train_bpe)
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


def test_saved_tokenizer_is_reused_only_for_the_same_data_and_size(nb, tmp_path, monkeypatch):
    cfg = dataclasses.replace(nb.cfg, work_dir=str(tmp_path), vocab_size=300)
    corpus = small_corpus(nb)
    real, trained = nb.train_bpe, []

    def counting_train_bpe(texts, vocab_size):
        trained.append(vocab_size)
        return real(texts, vocab_size)

    monkeypatch.setattr(nb, "train_bpe", counting_train_bpe)
    first = nb.load_or_train_bpe(cfg, corpus)
    folder = nb.run_folder(cfg)  # the data folder, beneath the work folder
    assert folder.parent == tmp_path and [p.name for p in tmp_path.iterdir()] == [folder.name]
    files = sorted(p.name for p in folder.iterdir())
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
    names = sorted(p.name for p in folder.iterdir())
    assert len(names) == 2 and files[0] in names and not any(name.endswith(".tmp") for name in names)
    assert len(list(nb.run_folder(dataclasses.replace(cfg, vocab_size=320)).iterdir())) == 1  # its own data folder


def test_damaged_tokenizer_is_trained_again(nb, tmp_path, capsys):
    """A tokenizer file cut short by a crash: the tokenizer is trained again (BPE training is deterministic: the same
    vocabulary) and saved over the damaged one."""
    cfg = dataclasses.replace(nb.cfg, work_dir=str(tmp_path), vocab_size=300)
    corpus = {split: tuple(lines[:300] for lines in nb.corpus[split]) for split in nb.SPLITS}
    first = nb.load_or_train_bpe(cfg, corpus)
    [path] = list(nb.run_folder(cfg).glob("bpe-300-*.json"))
    truncate_to_half(path)
    capsys.readouterr()
    again = nb.load_or_train_bpe(cfg, corpus)
    assert f"saved to the work folder as {path.parent.name}/{path.name}" in capsys.readouterr().out  # trained, not reused
    assert again.get_vocab() == first.get_vocab()
    assert json.loads(path.read_text())  # whole again
    assert nb.load_or_train_bpe(cfg, corpus).get_vocab() == first.get_vocab()


# ---------------------------------------------------------------- encode_corpus
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
    data = nb.encode_corpus(tok, corpus, max_len, nb.cfg.max_positions)

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
    """A validation pair longer than the positional table is left out of the validation/test ids by encode_corpus
    (saying so), so that validation_loss runs; the text itself stays in the corpus for BLEU, where decode_corpus
    truncates it."""
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


def test_no_training_pair_within_max_len_is_refused(nb, capsys):
    """Data whose training pairs are all longer than max_len: encode_corpus raises an error naming max_len, the
    length the shortest pair needs, and the fix; a held-out split whose every pair is longer than the positional
    table is refused, naming max_positions."""
    corpus = {split: tuple(lines[:20] for lines in nb.corpus[split]) for split in nb.SPLITS}
    with pytest.raises(ValueError, match=r"no train pair fits max_len=3 tokens: the shortest needs \d+.*Raise max_len"):
        nb.encode_corpus(nb.tokenizer, corpus, 3, 1024)
    held_out_too_long = {**corpus, "validation": (["Ein Hund. " * 20], ["A dog. " * 20])}
    with pytest.raises(ValueError, match=r"no validation pair fits the 16-position table: the shortest needs \d+.*Raise max_positions"):
        nb.encode_corpus(nb.tokenizer, held_out_too_long, 64, max_positions=16)
