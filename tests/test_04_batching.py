"""Section 4, batching by token count: make_batches, and the order of each epoch (epoch_order, section 8's)."""

from __future__ import annotations

import pytest
import torch


@pytest.mark.parametrize("gpu", [False, True], ids=["cpu", "gpu"])
@pytest.mark.parametrize("max_tokens", [None, 256])
def test_batches_respect_the_token_budget_and_keep_every_pair_once(nb, max_tokens, gpu):
    """Every pair once, in batches within max_tokens; a GPU's lengths are multiples of 8 with less than 8 of padding
    beyond the longest sentence, a CPU's end at the longest sentence."""
    src, tgt = nb.data["train"]
    max_tokens = max_tokens or nb.cfg.max_tokens
    batches = nb.make_batches(src, tgt, max_tokens, gpu)
    seen = []
    for b in batches:
        assert b.src.size(0) == b.tgt_in.size(0) == b.tgt_out.size(0)
        assert b.tgt_in.shape == b.tgt_out.shape
        assert b.src.numel() <= max_tokens and b.tgt_in.numel() <= max_tokens, (tuple(b.src.shape), tuple(b.tgt_in.shape))
        assert (b.tgt_in[:, 0] == nb.BOS).all()
        assert torch.equal(b.tgt_in[:, 1:], b.tgt_out[:, :-1])  # teacher forcing: the target shifted by one
        assert b.n_tokens == int((b.tgt_out != nb.PAD).sum())
        longest = int((b.src != nb.PAD).sum(1).max()), int((b.tgt_in != nb.PAD).sum(1).max())
        if gpu:  # no more padding than rounding up to a multiple of 8 needs
            assert b.src.size(1) % 8 == 0 and b.tgt_in.size(1) % 8 == 0
            assert b.src.size(1) - longest[0] < 8 and b.tgt_in.size(1) - longest[1] < 8
        else:
            assert (b.src.size(1), b.tgt_in.size(1)) == longest
        for s, t in zip(b.src.tolist(), b.tgt_out.tolist()):
            seen.append((tuple(x for x in s if x != nb.PAD), tuple(x for x in t if x != nb.PAD)))
    expected = [(tuple(s), tuple(t[1:])) for s, t in zip(src, tgt)]
    assert sorted(seen) == sorted(expected)  # every pair exactly once
    widths = [b.src.size(1) for b in batches]
    assert widths == sorted(widths)  # cut from the list sorted by source length


def test_epoch_order_is_a_permutation_fixed_by_seed_and_epoch(nb):
    order = nb.epoch_order(83, seed=1234, epoch=3)
    assert sorted(order) == list(range(83))
    with torch.random.fork_rng():
        torch.manual_seed(0)  # the global generator plays no part
        assert nb.epoch_order(83, seed=1234, epoch=3) == order
    assert nb.epoch_order(83, seed=1234, epoch=4) != order
    assert nb.epoch_order(83, seed=99, epoch=3) != order


def test_a_cpu_and_a_gpu_cut_the_same_batches(nb):
    """The same pairs in the same batches whether padded for a CPU or a GPU, so that both train alike."""
    cpu, gpu = (nb.make_batches(*nb.data["train"], nb.cfg.max_tokens, on_gpu) for on_gpu in (False, True))
    assert len(cpu) == len(gpu)
    for a, b in zip(cpu, gpu):
        assert torch.equal(a.src, b.src[:, : a.src.size(1)]) and not b.src[:, a.src.size(1):].any()
        assert torch.equal(a.tgt_out, b.tgt_out[:, : a.tgt_out.size(1)]) and not b.tgt_out[:, a.tgt_out.size(1):].any()
