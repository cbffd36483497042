"""Section 12, attention maps: record_attention_weights finds the attention layers of a trained model."""

from __future__ import annotations

import dataclasses

import torch


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
