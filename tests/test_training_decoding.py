"""Training and decoding: the loss, the learning-rate schedule and optimiser, decoding invariants, the tokenizer and
BLEU, and an end-to-end check that the smoke-sized model can memorise a few sentence pairs.

Everything runs on the CPU against the notebook's own definitions (the `nb` fixture of conftest.py).
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

CPU = torch.device("cpu")
DATA = Path(__file__).resolve().parent / "data" / "multi30k"

# Memorisation (section 5): these settings reach BLEU 100 on the 32 pairs after about 50-60 steps (seeds 0-3);
# the bound leaves a margin of roughly 2x. One step is one batch holding all the pairs.
MEMORISE_PAIRS = 32
MEMORISE_STEPS = 100
MEMORISE_MIN_BLEU = 90.0
MEMORISE_SETTINGS = {"dropout": 0.0, "label_smoothing": 0.1, "warmup_steps": 50, "lr_factor": 1.0}

N_DECODE = 8  # test sentences for the (costly) equivalence checks of decoding
ALPHA = 0.6  # the length penalty of beam_search's default and of the configs


# ---------------------------------------------------------------------------------------------------------------------
# helpers and fixtures


def encode_sources(nb, texts: list[str]) -> list[list[int]]:
    """Source ids exactly as decode_corpus builds them: tokenizer ids + [EOS]."""
    return [nb.tokenizer.encode(text).ids + [nb.EOS] for text in texts]


def padded(nb, ids: list[list[int]]) -> torch.Tensor:
    return nb.pad(ids, max(len(x) for x in ids))


@pytest.fixture(scope="module")
def test_ids(nb):
    """The first N_DECODE sentences of the test split, encoded like decode_corpus does (various lengths)."""
    return encode_sources(nb, nb.corpus["test"][0][:N_DECODE])


@pytest.fixture(scope="module")
def memorised(nb):
    """A smoke-sized model trained with train_step for MEMORISE_STEPS steps on one batch of MEMORISE_PAIRS pairs."""
    cfg = nb.make_config("smoke", **MEMORISE_SETTINGS)
    de, en = (lines[:MEMORISE_PAIRS] for lines in nb.corpus["train"])
    src = encode_sources(nb, de)
    tgt = [[nb.BOS] + nb.tokenizer.encode(text).ids + [nb.EOS] for text in en]
    batches = nb.make_batches(src, tgt, max_tokens=10**6)
    assert len(batches) == 1 and batches[0].src.size(0) == MEMORISE_PAIRS
    with torch.random.fork_rng():  # leave the global generator as other tests expect it
        torch.manual_seed(0)
        model = nb.build_model(cfg, nb.VOCAB)
        optimizer = nb.make_optimizer(model, cfg)
        amp_dtype, scaler = nb.amp_settings(CPU, cfg.amp)
        model.train()
        losses = []
        for step in range(1, MEMORISE_STEPS + 1):
            loss = nb.train_step(model, batches[0], optimizer, scaler, amp_dtype, cfg, step)
            assert loss is not None and torch.isfinite(loss), f"non-finite loss at step {step}"
            losses.append(loss.item() / batches[0].n_tokens)
    model.eval()
    return SimpleNamespace(model=model, cfg=cfg, de=de, en=en, src=src, losses=losses)


@pytest.fixture(scope="module")
def models(nb, memorised):
    """The untrained smoke model of the notebook and the briefly trained (memorising) one."""
    return {"untrained": nb.model, "trained": memorised.model}


def emitted_log_probs(nb, logits: torch.Tensor) -> torch.Tensor:
    """log P over the tokens an output may hold: <pad> and <bos> removed, the rest renormalised (fp32)."""
    allowed = torch.ones(logits.size(-1), dtype=torch.bool)
    allowed[[nb.PAD, nb.BOS]] = False
    return logits.float().masked_fill(~allowed, -math.inf).log_softmax(-1)


@torch.no_grad()
def beam_to_the_limit(nb, model, src1: torch.Tensor, beam: int, alpha: float, max_extra: int) -> list[int]:
    """A plain, one-sentence, cache-free beam search that never stops early: at every step each live hypothesis
    + <eos> is a finished candidate (scored log P / lp(length incl. <eos>)), the K most probable extensions by any
    other token live on, and this goes on until the length limit, where only <eos> is allowed. It shares no stopping
    rule with the notebook: a correct early stop can only save work, never change the result."""
    PAD, BOS, EOS = nb.PAD, nb.BOS, nb.EOS
    limit = int((src1 != PAD).sum()) - 1 + max_extra  # source tokens before its <eos>, + max_extra
    memory, src_mask = model.encode(src1)
    beams = [([], 0.0)]
    best, best_score = None, -math.inf
    for t in range(limit + 1):
        prefixes = torch.tensor([[BOS] + prefix for prefix, _ in beams])
        logp = emitted_log_probs(nb, model.decode(prefixes, memory.expand(len(beams), -1, -1), src_mask)[:, -1])
        for (prefix, score), row in zip(beams, logp):
            finished = (score + row[EOS].item()) / ((5 + t + 1) / 6) ** alpha
            if finished > best_score:
                best, best_score = prefix, finished
        if t == limit:
            break
        logp[:, EOS] = -math.inf
        grown = [(score + value, prefix + [v]) for (prefix, score), row in zip(beams, logp)
                 for value, v in zip(*(x.tolist() for x in row.topk(beam))) if math.isfinite(value)]
        beams = [(prefix, score) for score, prefix in sorted(grown, key=lambda g: -g[0])[:beam]]
    return best


class HashedTreeModel(torch.nn.Module):
    """A tiny stand-in for the Transformer whose next-token logits are a fixed random function of (the source's
    first token, the prefix so far): every prefix has its own distribution over a vocabulary of `vocab` ids, so
    that exhaustive enumeration of all outputs is possible. Vectorised, cache-free."""

    def __init__(self, seed: int, vocab: int = 8, sharpness: float = 2.5, table: int = 4099):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.logits = torch.randn(table, vocab, generator=generator) * sharpness
        self.decoder = torch.nn.ModuleList([torch.nn.Identity()])
        self.positions = torch.zeros(256, 1)

    def encode(self, src):
        return src[:, :1, None].float(), (src != 0)[:, None, None, :]

    def decode(self, tgt_in, memory, src_mask, cache=None):
        assert cache is None, "use the hashed model with use_cache=False"
        t = tgt_in.size(1)
        code = memory[:, 0, 0].long() * 7919
        out = []
        for p in range(t):
            code = (code * 31 + tgt_in[:, p] + 1) % self.logits.size(0)
            out.append(self.logits[code])
        return torch.stack(out, 1)


def exhaustive_best(nb, model, src1: torch.Tensor, alpha: float, max_extra: int) -> tuple[list[int], float, float]:
    """The output maximising log P(Y <eos>) / lp(|Y| + 1) over every Y of at most the length limit, found by
    enumerating them all (the same model, the same exclusion of <pad>/<bos>, only <eos> at the limit). Returns the
    best, its score, and the margin to the runner-up."""
    limit = int((src1 != nb.PAD).sum()) - 1 + max_extra
    memory, src_mask = model.encode(src1)
    scored = []

    def visit(prefix: list[int], logp_prefix: float) -> None:
        logp = emitted_log_probs(nb, model.decode(torch.tensor([[nb.BOS] + prefix]), memory, src_mask)[0, -1])
        scored.append(((logp_prefix + logp[nb.EOS].item()) / ((5 + len(prefix) + 1) / 6) ** alpha, prefix))
        if len(prefix) < limit:
            for v in range(logp.numel()):
                if v not in (nb.PAD, nb.BOS, nb.EOS):
                    visit(prefix + [v], logp_prefix + logp[v].item())

    visit([], 0.0)
    scored.sort(key=lambda s: -s[0])
    return scored[0][1], scored[0][0], scored[0][0] - scored[1][0]


class StandIn(torch.nn.Module):
    """What the decoders need of a Transformer besides decode(): encode() (here the source ids themselves as the
    memory, with the usual padding mask) and a decoder stack to size the cache by."""

    def __init__(self):
        super().__init__()
        self.decoder = torch.nn.ModuleList([torch.nn.Identity()])
        self.positions = torch.zeros(256, 1)  # what the decoders check lengths against

    def encode(self, src):
        return src[:, :, None].float(), (src != 0)[:, None, None, :]


class ScriptedModel(StandIn):
    """A stand-in for the Transformer whose next-token choice is scripted: the sentence whose source starts with
    token k prefers script[k][p] at output position p (token 5 once the script runs out). Logits: 10 for the
    preferred token, -10 for <eos> unless preferred, 0 for the rest (so that no tie involves <eos>), and optionally
    more for tokens that decoding must never emit."""

    def __init__(self, script: dict[int, list[int]], vocab: int = 16, boost: dict[int, float] | None = None):
        super().__init__()
        self.script, self.vocab, self.boost = script, vocab, boost or {}

    def decode(self, tgt_in, memory, src_mask, cache=None):
        assert cache is None, "use the scripted model with use_cache=False"
        n, t = tgt_in.shape
        logits = torch.zeros(n, t, self.vocab)
        logits[:, :, 2] = -10.0  # <eos> (id 2: the notebook asserts the special ids)
        for row in range(n):
            script = self.script[int(memory[row, 0, 0])]
            for p in range(t):
                logits[row, p, script[p] if p < len(script) else 5] = 10.0
        for token, value in self.boost.items():
            logits[:, :, token] = value
        return logits


class TreeModel(StandIn):
    """A stand-in for the Transformer with scripted next-token probabilities: table[prefix] = {token: p}. The rest of
    the mass is spread over tokens 8..15; <eos> gets 1e-9 unless the table says otherwise."""

    def __init__(self, table: dict[tuple, dict[int, float]], vocab: int = 16):
        super().__init__()
        self.table, self.vocab = table, vocab

    def decode(self, tgt_in, memory, src_mask, cache=None):
        assert cache is None, "use the tree model with use_cache=False"
        n, t = tgt_in.shape
        probs = torch.full((n, t, self.vocab), 1e-9, dtype=torch.float64)
        for row in range(n):
            for p in range(t):
                given = self.table.get(tuple(tgt_in[row, 1: p + 1].tolist()), {})
                for token, prob in given.items():
                    probs[row, p, token] = prob
                probs[row, p, 8:] = (1 - sum(given.values())) / (self.vocab - 8)
        return probs.log().float()


# ---------------------------------------------------------------------------------------------------------------------
# 1. the label-smoothed loss


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


# ---------------------------------------------------------------------------------------------------------------------
# 1b. batching by token count


@pytest.mark.parametrize("max_tokens", [None, 256])
def test_batches_respect_the_token_budget_and_keep_every_pair_once(nb, max_tokens):
    src, tgt = nb.data["train"]
    max_tokens = max_tokens or nb.cfg.max_tokens
    batches = nb.make_batches(src, tgt, max_tokens)
    seen = []
    for b in batches:
        assert b.src.size(0) == b.tgt_in.size(0) == b.tgt_out.size(0)
        assert b.tgt_in.shape == b.tgt_out.shape
        assert b.src.numel() <= max_tokens and b.tgt_in.numel() <= max_tokens, (tuple(b.src.shape), tuple(b.tgt_in.shape))
        assert b.src.size(1) % 8 == 0 and b.tgt_in.size(1) % 8 == 0
        assert (b.tgt_in[:, 0] == nb.BOS).all()
        assert torch.equal(b.tgt_in[:, 1:], b.tgt_out[:, :-1])  # teacher forcing: the target shifted by one
        assert b.n_tokens == int((b.tgt_out != nb.PAD).sum())
        # no more padding than rounding up to a multiple of 8 needs
        assert b.src.size(1) - int((b.src != nb.PAD).sum(1).max()) < 8
        assert b.tgt_in.size(1) - int((b.tgt_in != nb.PAD).sum(1).max()) < 8
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


# ---------------------------------------------------------------------------------------------------------------------
# 2. learning-rate schedule and optimiser

SCHEDULES = [(512, 4000), (256, 4000), (64, 200), (64, 50), (256, 7)]


@pytest.mark.parametrize("d_model, warmup", SCHEDULES)
def test_lr_peaks_exactly_at_warmup(nb, d_model, warmup):
    lr = lambda s: nb.transformer_lr(s, d_model, warmup)
    assert lr(warmup) == pytest.approx(d_model ** -0.5 * warmup ** -0.5, rel=1e-12)
    assert lr(warmup - 1) < lr(warmup) > lr(warmup + 1)
    assert max(range(1, 3 * warmup), key=lr) == warmup


@pytest.mark.parametrize("d_model, warmup", SCHEDULES)
def test_lr_warmup_is_linear_then_inverse_sqrt(nb, d_model, warmup):
    lr = lambda s: nb.transformer_lr(s, d_model, warmup)
    for s in sorted({1, 2, 3, warmup // 3 or 1, warmup // 2 or 1, warmup - 1 or 1, warmup}):
        assert lr(s) == pytest.approx(s * lr(1), rel=1e-9), f"step {s} of the warmup"
    for s in (warmup, warmup + 1, 2 * warmup, 10 * warmup, 100_000):
        assert lr(s) == pytest.approx(d_model ** -0.5 * s ** -0.5, rel=1e-9), f"step {s} after the warmup"
        assert lr(4 * s) == pytest.approx(lr(s) / 2, rel=1e-9)


@pytest.mark.parametrize("d_model, warmup", SCHEDULES)
def test_lr_step_one_is_the_first_step(nb, d_model, warmup):
    first = nb.transformer_lr(1, d_model, warmup)
    assert first > 0
    assert first == pytest.approx(d_model ** -0.5 * warmup ** -1.5, rel=1e-12)


def test_lr_factor_scales_the_schedule(nb):
    for s in (1, 37, 200, 5000):
        assert nb.transformer_lr(s, 64, 200, factor=2.0) == pytest.approx(2 * nb.transformer_lr(s, 64, 200), rel=1e-12)


def test_make_optimizer_is_adam_with_the_papers_settings(nb):
    cfg = nb.make_config("iwslt14")
    assert (cfg.d_model, cfg.warmup_steps, cfg.lr_factor) == (256, 4000, 1.0)
    model = nb.build_model(cfg, 64)  # a small vocabulary keeps this cheap; the sizes are the preset's
    optimizer = nb.make_optimizer(model, cfg)
    assert type(optimizer) is torch.optim.Adam
    assert len(optimizer.param_groups) == 1
    group = optimizer.param_groups[0]
    assert tuple(group["betas"]) == (0.9, 0.98)
    assert group["eps"] == 1e-9
    assert group["weight_decay"] == 0
    assert group["lr"] == pytest.approx(nb.transformer_lr(1, 256, 4000), rel=1e-12)
    optimised = {id(p) for p in group["params"]}
    assert optimised == {id(p) for p in model.parameters()}


@pytest.mark.parametrize("capability, expected", [((7, 5), torch.float16), ((8, 0), torch.bfloat16),
                                                   ((9, 0), torch.bfloat16), ((6, 0), torch.float16)])
def test_autocast_dtype_is_fp16_on_a_t4_and_bf16_from_ampere_on(nb, monkeypatch, capability, expected):
    """A T4 (compute capability 7.5) emulates bf16 slowly, although torch.cuda.is_bf16_supported() says True there."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert nb.autocast_dtype(torch.device("cuda")) is expected
    assert nb.autocast_dtype(torch.device("cuda"), enabled=False) is None
    assert nb.autocast_dtype(CPU) is None


@pytest.mark.parametrize("step", [1, 7, 200, 1234])
def test_train_step_uses_the_lr_of_its_step(nb, step):
    cfg = nb.make_config("smoke", dropout=0.0, lr_factor=2.0)  # d_model 64, warmup 200; a factor that must count
    torch.manual_seed(0)
    model = nb.build_model(cfg, nb.VOCAB)
    optimizer = nb.make_optimizer(model, cfg)
    amp_dtype, scaler = nb.amp_settings(CPU, cfg.amp)
    assert amp_dtype is None
    b = nb.train_batches[0]
    batch = nb.Batch(b.src[:4], b.tgt_in[:4], b.tgt_out[:4], int((b.tgt_out[:4] != nb.PAD).sum()))
    before = [p.detach().clone() for p in model.parameters()]
    model.train()
    loss = nb.train_step(model, batch, optimizer, scaler, amp_dtype, cfg, step)
    expected = nb.transformer_lr(step, cfg.d_model, cfg.warmup_steps, cfg.lr_factor)
    assert loss is not None and torch.isfinite(loss)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(expected, rel=1e-12)
    # Adam's first update moves each parameter by lr * g / (|g| + eps): exactly lr where the gradient is not tiny.
    # So the step really used this learning rate (set before optimizer.step, not after).
    largest = max((p.detach() - q).abs().max().item() for p, q in zip(model.parameters(), before))
    assert largest == pytest.approx(expected, rel=1e-3)


def test_train_step_equals_a_reference_adam_step(nb):
    """Three train_steps equal three hand-written ones: lr of the step, label-smoothed cross entropy over non-PAD
    targets per token, Adam(0.9, 0.98, 1e-9), fresh gradients each step."""
    import copy

    cfg = nb.make_config("smoke", dropout=0.0, lr_factor=2.0)
    with torch.random.fork_rng():
        torch.manual_seed(1)
        model = nb.build_model(cfg, nb.VOCAB)
    reference = copy.deepcopy(model)
    optimizer = nb.make_optimizer(model, cfg)
    amp_dtype, scaler = nb.amp_settings(CPU, cfg.amp)
    ref_optimizer = torch.optim.Adam(reference.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    batches = []
    for b in nb.train_batches[:2]:
        n = int((b.tgt_out[:6] != nb.PAD).sum())
        batches.append(nb.Batch(b.src[:6], b.tgt_in[:6], b.tgt_out[:6], n))
    model.train()
    reference.train()
    for step, batch in zip((50, 51, 52), (batches[0], batches[1], batches[0])):
        nb.train_step(model, batch, optimizer, scaler, amp_dtype, cfg, step)
        for group in ref_optimizer.param_groups:
            group["lr"] = cfg.lr_factor * cfg.d_model ** -0.5 * min(step ** -0.5, step * cfg.warmup_steps ** -1.5)
        logits = reference(batch.src, batch.tgt_in)
        loss = F.cross_entropy(logits.flatten(0, 1), batch.tgt_out.flatten(), ignore_index=nb.PAD,
                               label_smoothing=cfg.label_smoothing, reduction="sum") / batch.n_tokens
        loss.backward()
        ref_optimizer.step()
        ref_optimizer.zero_grad(set_to_none=True)
    d = cfg.d_model
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        if name.endswith("in_proj.bias"):  # the key bias cannot change attention: its gradient is rounding noise,
            p, q = torch.cat([p[:d], p[2 * d:]]), torch.cat([q[:d], q[2 * d:]])  # which Adam blows up to +-lr
        assert torch.allclose(p, q, rtol=1e-4, atol=1e-5), f"{name} differs by {(p - q).abs().max().item():.2e}"
    assert all(p.grad is None or not p.grad.any() for p in model.parameters()), "gradients left behind"


# ---------------------------------------------------------------------------------------------------------------------
# 3. decoding


@torch.no_grad()
def best_stop_on_the_greedy_path(nb, model, src1: torch.Tensor, alpha: float, max_extra: int) -> list[int]:
    """Follow the most probable token other than <eos> up to the length limit; of the prefixes on that path, each
    ended by <eos>, return the one with the highest log P / lp. This is what beam search with beam 1 computes."""
    limit = int((src1 != nb.PAD).sum()) - 1 + max_extra
    memory, src_mask = model.encode(src1)
    path, logp_path, candidates = [], 0.0, []
    for _ in range(limit + 1):
        logp = emitted_log_probs(nb, model.decode(torch.tensor([[nb.BOS] + path]), memory, src_mask)[0, -1])
        candidates.append(((logp_path + logp[nb.EOS].item()) / ((5 + len(path) + 1) / 6) ** alpha, list(path)))
        logp[[nb.PAD, nb.BOS, nb.EOS]] = -math.inf
        token = int(logp.argmax())
        path, logp_path = path + [token], logp_path + logp[token].item()
    return max(candidates, key=lambda c: c[0])[1]


@pytest.mark.parametrize("which", ["untrained", "trained"])
def test_beam_one_is_the_best_stop_on_the_greedy_path(nb, models, test_ids, which):
    """Beam 1 is not greedy decoding any more: it follows the most probable non-<eos> token and keeps the best
    place to stop on that path. Greedy's output (the path up to where <eos> is the most probable token) is one of
    those places, so beam 1 scores at least as high as greedy on every sentence."""
    model = models[which]
    src = padded(nb, test_ids)
    for max_extra in (3, 12):
        greedy = nb.greedy_decode(model, src, max_extra=max_extra)
        beam1 = nb.beam_search(model, src, beam=1, alpha=ALPHA, max_extra=max_extra)
        for i, ids in enumerate(test_ids):
            one = torch.tensor([ids])
            assert beam1[i] == best_stop_on_the_greedy_path(nb, model, one, ALPHA, max_extra), f"sentence {i}"
            assert nb.sequence_score(model, one, beam1[i], ALPHA) >= nb.sequence_score(model, one, greedy[i], ALPHA) - 1e-5


def test_a_longer_live_hypothesis_can_still_win(nb):
    """P(<eos>) = 0.40 at the first step, P(A) = 0.39, P(<eos> | A) = 0.99: [] scores log 0.40 / lp(1) = -0.916 and
    [A] scores log(0.39 * 0.99) / lp(2) = -0.868 at alpha 0.6. Stopping when the most probable extension is <eos>
    returns []; the exact rule keeps A alive because it may still win, and returns [A] for every beam size."""
    E, A = nb.EOS, 4
    model = TreeModel({(): {E: 0.40, A: 0.39}, (A,): {E: 0.99}})
    lp = lambda n: ((5 + n) / 6) ** ALPHA
    assert math.log(0.39 * 0.99) / lp(2) > math.log(0.40) / lp(1)
    for beam in (1, 2, 4):
        assert nb.beam_search(model, torch.tensor([[9, E]]), beam, ALPHA, max_extra=5, use_cache=False) == [[A]]
    assert nb.greedy_decode(model, torch.tensor([[9, E]]), max_extra=5, use_cache=False) == [[]]


def test_the_stopping_bound_counts_the_longest_possible_output(nb):
    """The bound is (best live log P) / lp(limit + 1): a live prefix can still grow to `limit` tokens and <eos>.
    Here that longest output is the best: with limit 2, [A] scores log 0.505 / lp(2) = -0.623 and [A B] scores
    log 0.495 / lp(3) = -0.592. After [A] is found, a bound over lp(limit) (-0.641) would call [A] unbeatable and
    stop; over lp(limit + 1) (-0.592) the search goes on and returns [A B]."""
    E, A, B = nb.EOS, 4, 5
    model = TreeModel({(): {A: 1.0 - 1e-6}, (A,): {E: 0.505, B: 0.495}, (A, B): {E: 1.0}})
    lp = lambda n: ((5 + n) / 6) ** ALPHA
    assert math.log(0.495) / lp(2) <= math.log(0.505) / lp(2) < math.log(0.495) / lp(3)
    for beam in (1, 2, 4):  # source [9, <eos>]: 1 token, + max_extra 1 = a limit of 2 tokens before <eos>
        assert nb.beam_search(model, torch.tensor([[9, E]]), beam, ALPHA, max_extra=1, use_cache=False) == [[A, B]]


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
@pytest.mark.parametrize("seed", range(6))
def test_a_beam_as_wide_as_the_search_space_finds_the_exhaustive_optimum(nb, seed, alpha):
    """On tiny models (8 ids, of which 5 can be emitted; at most 4 tokens before <eos>: 781 possible outputs), a beam
    as wide as the widest level of the search tree (5^4 = 625 prefixes) returns exactly the output that exhaustive
    enumeration finds best, in a batch of sentences with different length limits."""
    model = HashedTreeModel(seed)
    E = nb.EOS
    sources = [[11, 9, 9, E], [12, 9, E], [13, E]]  # length limits (tokens before <eos> + max_extra 1): 4, 3, 2
    src = nb.pad(sources, 4)
    expected = []
    for ids in sources:
        hyp, _, margin = exhaustive_best(nb, model, torch.tensor([ids]), alpha, max_extra=1)
        assert margin > 1e-5, "a near tie: pick another seed"
        expected.append(hyp)
    assert nb.beam_search(model, src, beam=625, alpha=alpha, max_extra=1, use_cache=False) == expected


@pytest.mark.parametrize("which", ["untrained", "trained"])
def test_cache_changes_nothing(nb, models, test_ids, which):
    src = padded(nb, test_ids)
    max_extra = 10 if which == "untrained" else 50  # the untrained model always runs to the limit: keep it short
    model = models[which]
    assert nb.greedy_decode(model, src, max_extra, use_cache=True) == nb.greedy_decode(model, src, max_extra,
                                                                                       use_cache=False)
    assert nb.beam_search(model, src, 4, ALPHA, max_extra, use_cache=True) == nb.beam_search(model, src, 4, ALPHA,
                                                                                          max_extra, use_cache=False)


@pytest.mark.parametrize("which", ["untrained", "trained"])
def test_batched_decoding_equals_one_sentence_at_a_time(nb, models, test_ids, which):
    model = models[which]
    max_extra = 10 if which == "untrained" else 50
    src = padded(nb, test_ids)
    assert (src == nb.PAD).any(), "the batch should mix lengths, so that padding is exercised"
    greedy = nb.greedy_decode(model, src, max_extra)
    beam = nb.beam_search(model, src, 4, ALPHA, max_extra)
    for i, ids in enumerate(test_ids):
        alone = torch.tensor([ids])
        assert nb.greedy_decode(model, alone, max_extra) == [greedy[i]], f"greedy, sentence {i}"
        assert nb.beam_search(model, alone, 4, ALPHA, max_extra) == [beam[i]], f"beam, sentence {i}"
    # and a padded copy of a short sentence (more padding than any batch above) decodes the same
    short = min(range(len(test_ids)), key=lambda i: len(test_ids[i]))
    extra_padding = nb.pad([test_ids[short]], len(test_ids[short]) + 9)
    assert nb.greedy_decode(model, extra_padding, max_extra) == [greedy[short]]
    assert nb.beam_search(model, extra_padding, 4, ALPHA, max_extra) == [beam[short]]


@pytest.mark.parametrize("which", ["untrained", "trained"])
@pytest.mark.parametrize("max_extra", [0, 3, 50])
def test_outputs_are_clean_and_within_the_length_limit(nb, models, test_ids, which, max_extra):
    if which == "untrained" and max_extra == 50:
        max_extra = 12  # the untrained model runs to the limit every time; a shorter one costs less
    src = padded(nb, test_ids)
    limit = nb.length_limit(src, max_extra).tolist()
    assert limit == [len(ids) - 1 + max_extra for ids in test_ids]  # source tokens before its <eos>, + max_extra
    for name, hyps in (("greedy", nb.greedy_decode(models[which], src, max_extra)),
                       ("beam 4", nb.beam_search(models[which], src, 4, ALPHA, max_extra))):
        assert len(hyps) == len(test_ids)
        for hyp, most in zip(hyps, limit):
            assert all(isinstance(token, int) for token in hyp)
            assert not {nb.EOS, nb.PAD, nb.BOS} & set(hyp), f"{name}: a special token in {hyp}"
            assert all(4 <= token < nb.VOCAB for token in hyp)
            assert len(hyp) <= most, f"{name}: {len(hyp)} tokens, limit {most}"
        if which == "untrained" and name == "greedy":  # <eos> is never its most probable token: runs to the limit
            assert any(len(hyp) == most for hyp, most in zip(hyps, limit)), f"{name}: the limit was never reached"


def test_strip_after_eos(nb):
    E = nb.EOS
    assert nb.strip_after_eos([5, 6, E, 7, E]) == [5, 6]
    assert nb.strip_after_eos([E, 5]) == []
    assert nb.strip_after_eos([5, 6]) == [5, 6]
    assert nb.strip_after_eos([]) == []


def test_decoding_stops_at_the_first_eos(nb):
    E = nb.EOS
    script = {4: [7, 8, 9, E, 10, 11, E], 5: [E, 6, 6], 6: [12, E, 13], 7: [9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9]}
    model = ScriptedModel(script)
    src = nb.pad([[4, 9, E], [5, E], [6, 8, 8, E], [7, E]], 4)  # limits: 2, 1, 3 and 1 tokens + max_extra 3
    expected = [[7, 8, 9], [], [12], [9] * 4]
    assert nb.greedy_decode(model, src, max_extra=3, use_cache=False) == expected
    for beam in (1, 2, 4):
        assert nb.beam_search(model, src, beam, ALPHA, max_extra=3, use_cache=False) == expected, f"beam {beam}"


def test_finished_sentences_leave_the_batch(nb):
    """Before: every sentence stayed in the batch until the last one ended, so one long output kept the decoder
    computing all the finished ones. Now the rows a decoding step feeds the model are those still going."""
    E = nb.EOS
    model = ScriptedModel({4: [E], 5: [7, E], 6: [8, 8, 8, 8, E]})
    rows_fed = []
    decode = model.decode
    model.decode = lambda tgt_in, *rest, **kw: (rows_fed.append(tgt_in.size(0)), decode(tgt_in, *rest, **kw))[1]
    src = nb.pad([[6, 8, E], [4, 9, E], [5, E]], 3)  # they finish in the order 2nd, 3rd, 1st
    expected = [[8, 8, 8, 8], [], [7]]  # in input order
    assert nb.greedy_decode(model, src, max_extra=6, use_cache=False) == expected
    assert rows_fed == [3, 2, 1, 1, 1]
    rows_fed.clear()
    assert nb.beam_search(model, src, 2, ALPHA, max_extra=6, use_cache=False) == expected
    assert rows_fed[:2] == [6, 4] and set(rows_fed[2:]) == {2}, rows_fed


def test_pad_and_bos_are_never_emitted(nb):
    E = nb.EOS
    model = ScriptedModel({4: [7, 7, E]}, boost={nb.PAD: 30.0, nb.BOS: 20.0})  # PAD and BOS are the most likely
    src = torch.tensor([[4, E]])
    assert nb.greedy_decode(model, src, max_extra=5, use_cache=False) == [[7, 7]]
    assert nb.beam_search(model, src, 3, ALPHA, max_extra=5, use_cache=False) == [[7, 7]]


@pytest.mark.parametrize("alpha, log_p_long, winner", [
    (0.6, -1.175, "short"),  # -1/lp(2) = -0.912 > -1.175/lp(4) = -0.921; with lp(1), lp(3) the long one would win
    (0.6, -1.150, "long"),  # -0.912 < -1.150/lp(4) = -0.902; without any length penalty the short one would win
    (0.0, -1.050, "short"),  # no length penalty: raw log-probabilities
    (1.0, -1.200, "long"),  # -1/(7/6) = -0.857 < -1.2/(9/6) = -0.800
])
def test_beam_search_applies_the_length_penalty(nb, alpha, log_p_long, winner):
    """Two hypotheses finish: 'short' = [4] <eos> with log P = -1, 'long' = [5, 6, 7] <eos> with log P = log_p_long.
    Beam search must return the one with the higher log P / ((5 + length incl. <eos>) / 6) ** alpha."""
    E = nb.EOS
    p4, p5 = 0.5, 0.45
    step_long = math.exp((log_p_long - math.log(p5)) / 3)  # 5 -> 6 -> 7 -> <eos>, each with this probability
    table = {(): {4: p4, 5: p5}, (4,): {E: math.exp(-1 - math.log(p4))},
             (5,): {6: step_long}, (5, 6): {7: step_long}, (5, 6, 7): {E: step_long}}
    lp = lambda n: ((5 + n) / 6) ** alpha
    short, long = -1 / lp(2), log_p_long / lp(4)
    assert (short > long) == (winner == "short") and abs(short - long) > 1e-3  # the case is what it says
    expected = [4] if winner == "short" else [5, 6, 7]
    model = TreeModel(table)
    for beam in (2, 4):
        assert nb.beam_search(model, torch.tensor([[9, E]]), beam, alpha, max_extra=10, use_cache=False) == [expected]
    assert nb.greedy_decode(model, torch.tensor([[9, E]]), max_extra=10, use_cache=False) == [[4]]


def test_beam_search_equals_a_beam_that_never_stops_early(nb, memorised, test_ids):
    """Beam search (batched, cached, stopping as soon as no live hypothesis can win) returns the same hypothesis as a
    plain per-sentence beam search that runs every sentence to its length limit, on sentences the model knows
    (training pairs), on unseen ones, and with a length limit that binds."""
    model = memorised.model
    cases = [(memorised.src[:10], 50, (2, 4)), (test_ids[:4], 50, (4,)), (test_ids[4:], 3, (1, 2, 4))]
    for ids, max_extra, beams in cases:
        src = padded(nb, ids)
        for beam in beams:
            hyps = nb.beam_search(model, src, beam, ALPHA, max_extra)
            for i, row in enumerate(ids):
                ref = beam_to_the_limit(nb, model, torch.tensor([row]), beam, ALPHA, max_extra)
                assert hyps[i] == ref, f"beam {beam}, max_extra {max_extra}, sentence {i}"


def test_sequence_score_is_the_normalised_log_probability(nb, memorised):
    model, ids = memorised.model, memorised.src[0]
    hyp = nb.greedy_decode(model, torch.tensor([ids]))[0]
    src = torch.tensor([ids])
    tgt = torch.tensor([[nb.BOS] + hyp + [nb.EOS]])
    with torch.no_grad():
        logp = emitted_log_probs(nb, model(src, tgt[:, :-1]))[0]
    total = sum(logp[i, tok].item() for i, tok in enumerate(tgt[0, 1:].tolist()))
    lp = ((5 + len(hyp) + 1) / 6) ** ALPHA
    assert nb.sequence_score(model, src, hyp, ALPHA) == pytest.approx(total / lp, rel=1e-5)


def test_beam_scores_at_least_greedy(nb, memorised):
    """On a trained model, beam 4's hypothesis should score (log P / lp, what it maximises) at least as high as
    greedy's for nearly every sentence and on average. Beam search is not exact, so one in ten may be worse.

    The model is the memorising one, on 48 validation sentences it has never seen: it is confident, but not so
    sure of one path that beam and greedy agree (on its own training pairs they always do, which tests nothing;
    here about 70 % of the outputs differ). A smoke model trained ~150 steps on nb.train_batches is so poor
    (repetition loops) that beam loses on 10-50 % of sentences depending on the seed: no stable test."""
    model = memorised.model
    ids = encode_sources(nb, nb.corpus["validation"][0][:48])
    src = padded(nb, ids)
    greedy = nb.greedy_decode(model, src)
    beam = nb.beam_search(model, src, 4, ALPHA)
    assert sum(g != b for g, b in zip(greedy, beam)) >= len(ids) // 4, "beam and greedy agree: nothing is compared"
    g = [nb.sequence_score(model, torch.tensor([x]), hyp, ALPHA) for x, hyp in zip(ids, greedy)]
    b = [nb.sequence_score(model, torch.tensor([x]), hyp, ALPHA) for x, hyp in zip(ids, beam)]
    at_least = sum(bs >= gs - 1e-4 for bs, gs in zip(b, g))
    assert at_least >= 0.9 * len(g), f"beam >= greedy on {at_least} of {len(g)} sentences"
    assert sum(b) / len(b) > sum(g) / len(g)


# ---------------------------------------------------------------------------------------------------------------------
# 4. text: tokenizer and BLEU


@pytest.mark.parametrize("lang", ["de", "en"])
def test_tokenizer_round_trips_every_test_line(nb, lang):
    lines = (DATA / f"test.{lang}").read_text(encoding="utf-8").split("\n")
    lines = lines[:-1] if lines[-1] == "" else lines
    assert len(lines) == 1000
    encodings = nb.tokenizer.encode_batch(lines)
    bad = [line for line, e in zip(lines, encodings) if nb.tokenizer.decode(e.ids) != line]
    assert not bad, f"{len(bad)} lines do not round-trip, e.g. {bad[:3]}"
    assert all(nb.UNK not in e.ids for e in encodings)


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
    """A sentence containing "<pad>" or "<eos>" must not get padding or end-of-sentence ids (masks would cut it)."""
    fresh = nb.train_bpe(["a <pad> b <eos> c"] * 5, 300)
    reloaded = nb.load_or_train_bpe(dataclasses.replace(nb.cfg, work_dir=str(tmp_path)), nb.corpus)
    reused = nb.load_or_train_bpe(dataclasses.replace(nb.cfg, work_dir=str(tmp_path)), nb.corpus)  # from file
    text = "ein <pad> und <eos> oder <bos>, <unk>"
    for tokenizer in (fresh, nb.tokenizer, reloaded, reused):
        ids = tokenizer.encode(text).ids
        assert not set(ids) & {nb.PAD, nb.BOS, nb.EOS, nb.UNK}, ids
        assert tokenizer.decode(ids) == text


def sacrebleu_cli() -> list[str]:
    exe = shutil.which("sacrebleu")
    return [exe] if exe else [sys.executable, "-m", "sacrebleu"]


def test_corpus_bleu_equals_the_sacrebleu_command_line(nb, tmp_path):
    refs = nb.corpus["test"][1][:300]
    hyps = []
    for i, ref in enumerate(refs):  # deterministic damage of various kinds
        words = ref.split()
        if i % 4 == 0:
            words = words[::2]
        elif i % 4 == 1:
            words = words[1:] + words[:1]
        elif i % 4 == 2:
            words = [w.lower() for w in words]
        hyps.append(" ".join(words))
    hyps[5] = ""
    ref_file, hyp_file = tmp_path / "ref.en", tmp_path / "hyp.en"
    ref_file.write_text("\n".join(refs) + "\n", encoding="utf-8")
    hyp_file.write_text("\n".join(hyps) + "\n", encoding="utf-8")
    score, signature = nb.corpus_bleu(hyps, refs)
    out = subprocess.run([*sacrebleu_cli(), str(ref_file), "-i", str(hyp_file), "-b", "-w", "2"], capture_output=True, text=True,
                         check=True)
    cli_score = float(out.stdout.strip())
    assert 10 < score < 90  # a non-trivial case
    assert round(score, 2) == pytest.approx(cli_score, abs=0.005)
    assert round(nb.corpus_bleu(refs, refs)[0], 2) == 100.0
    assert "tok:13a" in signature and "nrefs:1" in signature and "case:mixed" in signature


def test_headline_bleu_on_tokenized_references_is_on_whitespace_tokens(nb):
    """For tokenized references (IWSLT14 as fairseq prepares it) the headline is sacreBLEU with tokenize="none",
    which differs from the default 13a (it re-splits '&apos;s' into '& apos ; s'); for detokenized references it
    is 13a. The signature names the tokenizer used."""
    import sacrebleu

    refs = ["it &apos;s not that i don &apos;t like it .", "we &apos;re here , and they &apos;ll come ."]
    hyps = ["it &apos;s not that i like it .", "we &apos;re here and they come ."]
    tokenize = nb.headline_tokenize(nb.text_style(refs * 50))
    assert tokenize == "none"
    score, signature = nb.corpus_bleu(hyps, refs, tokenize)
    assert score == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs], tokenize="none").score)
    assert abs(score - sacrebleu.corpus_bleu(hyps, [refs]).score) > 1.0
    assert "tok:none" in signature and "tok:13a" in nb.corpus_bleu(hyps, refs)[1]
    assert nb.headline_tokenize(nb.text_style(nb.corpus["test"][1])) == "13a"  # Multi30k: cased, detokenized


# ---------------------------------------------------------------------------------------------------------------------
# 5. learning: memorise a few pairs


def test_memorises_a_few_pairs(nb, memorised):
    hyps = nb.decode_corpus(memorised.model, nb.tokenizer, memorised.de, memorised.cfg, CPU, beam=1)
    bleu, _ = nb.corpus_bleu(hyps, memorised.en)
    assert bleu > MEMORISE_MIN_BLEU, (
        f"BLEU {bleu:.1f} after {MEMORISE_STEPS} steps on {MEMORISE_PAIRS} pairs; loss per token "
        f"{memorised.losses[0]:.2f} -> {memorised.losses[-1]:.2f}; e.g. {hyps[0]!r} for {memorised.en[0]!r}")
    assert memorised.losses[-1] < 0.5 * memorised.losses[0]
