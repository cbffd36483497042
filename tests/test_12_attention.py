"""Section 12, attention maps: record_attention_weights finds the attention layers of a trained model; the check on
cross-attention's parking."""

from __future__ import annotations

import contextlib
import dataclasses
from types import SimpleNamespace

import matplotlib.pyplot as plt
import pytest
import torch
from helpers import CPU


def test_attention_maps_survive_a_redefined_attention_class(nb, monkeypatch):
    """The attention cell re-run after training defines a new MultiHeadAttention class, of which the trained layers
    are not instances: record_attention_weights still finds them (by what they do, not by their class)."""
    model = nb.build_model(nb.cfg, nb.VOCAB).eval()
    monkeypatch.setattr(nb, "MultiHeadAttention", type("MultiHeadAttention", (torch.nn.Module,), {}))
    batch = nb.valid_batches[0]
    with nb.record_attention_weights(model), torch.no_grad():
        model(batch.src[:1], batch.tgt_in[:1])
        kept = [layer.cross_attn.weights for layer in model.decoder]
    assert all(w is not None and w.shape[0] == 1 for w in kept)
    assert not any(m._forward_hooks for m in model.modules())  # the hooks are gone


def test_attention_maps_of_a_model_left_in_training_mode_have_no_dropout(nb):
    """After training the model is in training mode (dropout on): the maps record_attention_weights draws are those
    of the model without dropout, the same on every call, and the model is left in the mode it was in."""
    model = nb.build_model(dataclasses.replace(nb.cfg, dropout=0.5), nb.VOCAB).train()
    batch = nb.valid_batches[0]

    def maps():
        with nb.record_attention_weights(model), torch.no_grad():
            model(batch.src[:1], batch.tgt_in[:1])
            return [layer.cross_attn.weights.clone() for layer in model.decoder]

    first, again = maps(), maps()
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert model.training


@pytest.mark.parametrize(("looks_at", "holds"), [
    ((0, 0, 0, -2, -2, -1, 1, 2, 3, 4), True),  # 6 rows on the first, last and <eos> pieces, but 7 pieces in all
    ((2,) * 10, False),  # every row on one piece in the middle
    ((-1,) * 7 + (1, 2, 3), False),  # most rows on <eos>
    ((-2,) * 4 + (-1,) * 4 + (1, 2), False),  # two sinks, the final "." and <eos>: neither takes most rows
    ((-1,), False),  # an empty translation (exercise 8's model): one row, on <eos>, has nothing to align
    ((0, 3, 3), True),  # a two-word translation and its <eos>, on two pieces
])
def test_the_attention_cells_parking_check_asks_whether_the_rows_crowd_onto_few_pieces(nb, monkeypatch, capsys,
                                                                                       looks_at, holds):
    """Section 12's check: cross-attention parks when the English tokens' hardest looks crowd onto few German pieces
    (fewer than half as many as the tokens, or a single one), whichever pieces they are. Several tokens rightly aligned with the first
    piece ("Leute" -> "People") or the final "." are not parking (the old check counted them as parked). The
    cross-attention weights are set by hand."""
    hyp = list(range(10, 9 + len(looks_at)))  # a row for each token and one for <eos>
    sentence = "Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt."
    n_src = len(nb.tokenizer.encode(sentence).ids[: nb.source_room(nb.cfg)]) + 1
    assert n_src >= 7
    weights = torch.full((1, nb.cfg.n_heads, len(looks_at), n_src), 0.1)
    for row, col in enumerate(looks_at):
        weights[0, :, row, col % n_src] = 0.9
    real_record = nb.record_attention_weights

    @contextlib.contextmanager
    def record_then_set(model):
        with real_record(model):  # its hooks first, then ours, which overwrite the cross-attention weights
            hooks = [layer.cross_attn.register_forward_hook(lambda m, args, out: setattr(m, "weights", weights))
                     for layer in model.decoder]
            yield model
            for hook in hooks:
                hook.remove()

    monkeypatch.setattr(nb, "greedy_decode", lambda model, src, max_extra: [hyp])
    monkeypatch.setattr(nb, "record_attention_weights", record_then_set)
    model = nb.build_model(nb.cfg, nb.VOCAB)
    nb.draw_attention(model, sentence, nb.tokenizer, nb.cfg, CPU)
    plt.close("all")
    verdict = capsys.readouterr().out.strip().splitlines()[-1]
    assert verdict.startswith(("✓" if holds else "✗") + " cross-attention does not park"), verdict


def test_the_sentence_drawn_is_the_best_translated_of_the_first_tries_in_the_length_range(nb, monkeypatch):
    """pick_sentence, as its docstring says: of the first `tries` test sentences whose length (BPE tokens) is in range,
    else the nearest to the range, the one whose greedy translation scores the highest sentence BLEU, with its own
    reference. Tokens and translations are set by hand: a token is a word, a translation is looked up."""
    lengths = (3, 8, 15, 11, 20)
    sources = [" ".join(f"s{i}w{j}" for j in range(n)) for i, n in enumerate(lengths)]
    refs = [f"reference {i} : a man rides a red bike down the busy street ." for i in range(len(lengths))]
    hyps = dict(zip(sources, refs))  # right, except the two below
    hyps[sources[1]] = "reference 1 : a man rides a bus ."
    hyps[sources[2]] = "reference 2 : a man rides a red bike down the street ."
    assert nb.corpus_bleu([hyps[sources[2]]], [refs[2]])[0] > nb.corpus_bleu([hyps[sources[1]]], [refs[1]])[0]
    words = SimpleNamespace(encode=lambda text: SimpleNamespace(ids=text.split()))  # a tokenizer: a word is a token
    monkeypatch.setattr(nb, "decode_corpus", lambda model, tokenizer, texts, *args, **kwargs: [hyps[t] for t in texts])

    def pick(**kwargs):
        return nb.pick_sentence(None, (sources, refs), words, nb.cfg, CPU, **kwargs)

    assert pick(tries=2) == (sources[2], refs[2])  # in 8..15: sentences 1, 2 and 3; the first two compete
    assert pick(tries=3) == (sources[3], refs[3])  # sentence 3, translated right, now competes
    assert pick(shortest=18, longest=25, tries=1) == (sources[4], refs[4])
    assert pick(shortest=1, longest=2, tries=1) == (sources[0], refs[0])  # none in range: the nearest, 3 tokens
