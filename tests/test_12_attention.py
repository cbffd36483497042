"""Section 12, attention maps: keep_attention_weights finds the attention layers of a trained model."""

from __future__ import annotations

import torch


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
    assert not any(m._forward_hooks for m in model.modules())  # the hooks are gone
