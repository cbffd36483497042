"""Section 6, label-smoothed cross-entropy: label_smoothed_loss against torch and by hand, and batch_loss
on a CPU's and a GPU's padding."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import tiny_setup


# ---------------------------------------------------------------- label_smoothed_loss
@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_loss_matches_torch_cross_entropy(nb, eps):
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 7, 11, generator=g) * 3
    target = torch.randint(4, 11, (3, 7), generator=g)
    target[0, 5:] = nb.PAD
    target[2, 2:] = nb.PAD
    loss, nll = nb.label_smoothed_loss(logits, target, eps)
    flat_logits, flat_target = logits.view(-1, 11), target.view(-1)
    expected = F.cross_entropy(flat_logits, flat_target, label_smoothing=eps, ignore_index=nb.PAD, reduction="sum")
    expected_nll = F.cross_entropy(flat_logits, flat_target, ignore_index=nb.PAD, reduction="sum")
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert nll.item() == pytest.approx(expected_nll.item(), rel=1e-5)


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.5, 0.9])
def test_loss_of_uniform_logits_is_log_vocab(nb, eps):
    logits = torch.full((5, 4), 2.5)  # V = 4, every token equally likely
    target = torch.tensor([3, 1, 2, 3, nb.PAD])
    real = int((target != nb.PAD).sum())
    loss, nll = nb.label_smoothed_loss(logits, target, eps)
    assert loss.item() == pytest.approx(real * math.log(4), rel=1e-6)
    assert nll.item() == pytest.approx(real * math.log(4), rel=1e-6)


def test_loss_hand_computed(nb):
    # p = (1/4, 1/2, 1/4) over V = 3; the correct token is 1; eps = 0.3:
    # NLL = ln 2; mean of -log p = (ln 4 + ln 2 + ln 4) / 3 = 5/3 ln 2; loss = 0.7 ln 2 + 0.3 * 5/3 ln 2 = 1.2 ln 2
    logits = torch.log(torch.tensor([[1.0, 2.0, 1.0]])) + 7.0  # an offset changes nothing
    loss, nll = nb.label_smoothed_loss(logits, torch.tensor([1]), 0.3)
    assert nll.item() == pytest.approx(math.log(2), rel=1e-6)
    assert loss.item() == pytest.approx(1.2 * math.log(2), rel=1e-6)
    # two positions, one of them PAD: only the first counts. V = 2, p = (e/(1+e), 1/(1+e)), correct token 1, eps 0.2
    logits = torch.tensor([[1.0, 0.0], [5.0, -5.0]])
    loss, nll = nb.label_smoothed_loss(logits, torch.tensor([1, nb.PAD]), 0.2)
    log_p1, log_p0 = -math.log(1 + math.e), 1 - math.log(1 + math.e)
    assert nll.item() == pytest.approx(-log_p1, rel=1e-6)
    assert loss.item() == pytest.approx(0.8 * -log_p1 + 0.2 * -(log_p0 + log_p1) / 2, rel=1e-6)


def test_loss_ignores_pad_positions(nb):
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 6, 9, generator=g)
    target = torch.randint(4, 9, (2, 6), generator=g)
    target[:, 4:] = nb.PAD
    target[1, 1] = nb.PAD  # a PAD in the middle, too
    base = nb.label_smoothed_loss(logits, target, 0.1)
    changed = logits.clone()
    changed[target == nb.PAD] = torch.randn(int((target == nb.PAD).sum()), 9, generator=g) * 50
    after = nb.label_smoothed_loss(changed, target, 0.1)
    assert torch.equal(base[0], after[0]) and torch.equal(base[1], after[1])
    # and the non-PAD positions alone give the same sums
    keep = target != nb.PAD
    alone = nb.label_smoothed_loss(logits[keep], target[keep], 0.1)
    assert base[0].item() == pytest.approx(alone[0].item(), rel=1e-6)
    assert base[1].item() == pytest.approx(alone[1].item(), rel=1e-6)
    # nothing but PAD: zero loss
    zero = nb.label_smoothed_loss(logits, torch.full_like(target, nb.PAD), 0.1)
    assert zero[0].item() == 0.0 and zero[1].item() == 0.0


def test_loss_of_low_precision_logits_is_computed_in_fp32(nb):
    g = torch.Generator().manual_seed(3)
    logits = (torch.randn(4, 50, generator=g) * 4).bfloat16()
    target = torch.tensor([5, 6, nb.PAD, 7])
    loss, nll = nb.label_smoothed_loss(logits, target, 0.1)
    assert loss.dtype == torch.float32 and nll.dtype == torch.float32
    expected = F.cross_entropy(logits.float(), target, label_smoothing=0.1, ignore_index=nb.PAD, reduction="sum")
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)


# ---------------------------------------------------------------- batch_loss: a CPU's padding and a GPU's
def model_sums_and_gradients(model, loss_of_model) -> tuple[torch.Tensor, dict]:
    """(the loss and NLL sums that loss_of_model() gives, stacked; the gradient of the loss for every weight)."""
    model.zero_grad()
    loss, nll = loss_of_model()
    loss.backward()
    return torch.stack([loss, nll]), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_a_batch_padded_for_the_cpu_trains_as_the_gpus_padding_does(nb, tmp_path):
    """The CPU's batches, padded only to their longest sentence, give the loss, NLL and gradients of the same batches
    padded to multiples of 8 (a GPU's), in training mode without dropout (its masks depend on the tensor's shape)."""
    _, model, _ = tiny_setup(nb, tmp_path, dropout=0.0)
    pairs = [x[:40] for x in nb.data["train"]]
    (cpu, *_), (gpu, *_) = (nb.make_batches(*pairs, 4096, on_gpu) for on_gpu in (False, True))
    assert gpu.src.numel() > cpu.src.numel() and gpu.tgt_in.numel() > cpu.tgt_in.numel()
    (cpu_loss, cpu_grads), (gpu_loss, gpu_grads) = (model_sums_and_gradients(model, lambda b=b: nb.batch_loss(model, b, 0.1))
                                                    for b in (cpu, gpu))
    torch.testing.assert_close(cpu_loss, gpu_loss, rtol=1e-5, atol=1e-4)
    for name, grad in gpu_grads.items():
        torch.testing.assert_close(cpu_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_the_floor_cell_prints_the_floor_for_every_smoothing(nb, eps, capsys):
    """Exercise 3 (label_smoothing=0.0) re-runs section 6's floor cell: its perfect model's loss is the floor, not nan."""
    import dataclasses
    import re

    import nbformat
    from nbloader import NOTEBOOK

    source = next(c.source for c in nbformat.read(NOTEBOOK, as_version=4).cells
                  if c.cell_type == "code" and "def smoothing_floor(" in c.source)
    exec(source, {**vars(nb), "cfg": dataclasses.replace(nb.cfg, label_smoothing=eps)})  # noqa: S102
    printed = capsys.readouterr().out
    loss, floor = map(float, re.search(r"✓ a model that predicts the smoothed target exactly pays the floor .*: (\S+) vs "
                                       r"(\S+) nats per token", printed).groups())
    assert math.isclose(floor, loss, abs_tol=2e-4), (floor, loss)


def test_eval_mode_switches_dropout_off_and_gives_the_mode_back(nb):
    """One way to switch dropout off for a block (section 6's eval_mode, which in_eval_mode and the attention
    recorder use): eval inside, the mode the model had afterwards, an error included."""
    model = torch.nn.Dropout(0.5)
    for start in (True, False):
        model.train(start)
        with nb.eval_mode(model):
            assert not model.training
        assert model.training == start
    model.train()
    with pytest.raises(KeyError), nb.eval_mode(model):
        raise KeyError("inside")
    assert model.training
    assert nb.in_eval_mode(lambda m: m.training)(model) is False and model.training
