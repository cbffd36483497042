"""Section 5, the model: parity with torch.nn on copied weights, and the paper's invariants, in the order of the
subsections (5.1 positions to 5.9 the whole model).

Everything runs in float32 on the CPU with small sizes. Parity tests run in eval mode with autograd enabled,
which keeps torch.nn's encoder on its reference ("slow") path rather than the fused/nested-tensor fast path.
"""

from __future__ import annotations

import copy
import inspect
import math
import re
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn

D, HEADS, D_FF, VOCAB, LAYERS, DROPOUT, MAX_POS = 16, 4, 32, 29, 2, 0.1, 64
TOL = {"atol": 1e-5, "rtol": 0.0}


def tokens(lengths: list[int], total: int, seed: int, low: int = 3, high: int = VOCAB, bos: bool = False) -> torch.Tensor:
    """(len(lengths), total) random ids in [low, high), row i holding lengths[i] tokens, right-padded with PAD=0."""
    g = torch.Generator().manual_seed(seed)
    out = torch.zeros(len(lengths), total, dtype=torch.long)
    for row, n in enumerate(lengths):
        out[row, :n] = torch.randint(low, high, (n,), generator=g)
        if bos:
            out[row, 0] = 1
    return out


def randomize_norms(module: nn.Module, seed: int) -> None:
    """Give every LayerNorm a non-trivial affine map, so that swapping two norms cannot go unnoticed."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) + 0.5)
                m.bias.copy_(torch.rand(m.bias.shape, generator=g) - 0.5)


def copy_params(dst: nn.Module, src: nn.Module) -> None:
    """dst.weight, dst.bias <- src.weight, src.bias (a Linear or a LayerNorm)."""
    with torch.no_grad():
        dst.weight.copy_(src.weight)
        dst.bias.copy_(src.bias)


def load_mha(theirs: nn.MultiheadAttention, ours: nn.Module) -> None:
    """Our fused in_proj has nn.MultiheadAttention's in_proj_weight/in_proj_bias layout (q, k, v stacked)."""
    with torch.no_grad():
        theirs.in_proj_weight.copy_(ours.in_proj.weight)
        theirs.in_proj_bias.copy_(ours.in_proj.bias)
    copy_params(theirs.out_proj, ours.out_proj)


def load_encoder_layer(theirs: nn.TransformerEncoderLayer, ours: nn.Module) -> None:
    load_mha(theirs.self_attn, ours.self_attn)
    copy_params(theirs.linear1, ours.feed_forward.linear1)
    copy_params(theirs.linear2, ours.feed_forward.linear2)
    copy_params(theirs.norm1, ours.residual_attn.norm)
    copy_params(theirs.norm2, ours.residual_ff.norm)


def load_decoder_layer(theirs: nn.TransformerDecoderLayer, ours: nn.Module) -> None:
    load_mha(theirs.self_attn, ours.self_attn)
    load_mha(theirs.multihead_attn, ours.cross_attn)
    copy_params(theirs.linear1, ours.feed_forward.linear1)
    copy_params(theirs.linear2, ours.feed_forward.linear2)
    copy_params(theirs.norm1, ours.residual_self.norm)
    copy_params(theirs.norm2, ours.residual_cross.norm)
    copy_params(theirs.norm3, ours.residual_ff.norm)


def torch_causal(n: int) -> torch.Tensor:
    """torch.nn's boolean attn_mask convention is the opposite of ours: True = NOT allowed."""
    return torch.ones(n, n, dtype=torch.bool).triu(1)


@pytest.fixture(scope="module")
def base_model(nb: types.ModuleType) -> nn.Module:
    torch.manual_seed(0)
    model = nb.Transformer(VOCAB, D, HEADS, D_FF, LAYERS, LAYERS, DROPOUT, MAX_POS)
    randomize_norms(model, seed=1)
    return model.eval()


@pytest.fixture
def model(base_model: nn.Module) -> nn.Module:
    """A fresh copy (eval mode) that a test may change freely."""
    return copy.deepcopy(base_model).eval()


# ---------------------------------------------------------------- 5.1 positional encoding
def test_sinusoidal_positions_match_formula(nb: types.ModuleType) -> None:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)), computed with math."""
    d = 64
    table = nb.sinusoidal_positions(600, d)
    assert table.shape == (600, d)
    for pos in (0, 1, 5, 37, 599):
        for i in (0, 1, 7, 20, 31):
            angle = pos / 10000 ** (2 * i / d)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


# ---------------------------------------------------------------- 5.4 multi-head attention
@pytest.mark.parametrize("case", ["self-padding", "self-causal", "cross-padding"])
def test_mha_matches_torch(nb: types.ModuleType, case: str) -> None:
    """MultiHeadAttention == nn.MultiheadAttention (outputs, and the per-head weights record_attention_weights
    computes with section 5.2's attention()) with masks translated."""
    torch.manual_seed(10)
    ours = nb.MultiHeadAttention(D, HEADS, DROPOUT).eval()
    theirs = nn.MultiheadAttention(D, HEADS, dropout=DROPOUT, batch_first=True).eval()
    load_mha(theirs, ours)
    x, memory = torch.randn(3, 6, D), torch.randn(3, 5, D)
    with nb.record_attention_weights(ours):
        if case == "self-padding":
            keys = tokens([6, 4, 2], 6, seed=11)
            out = ours(x, mask=nb.padding_mask(keys))
            ref, ref_w = theirs(x, x, x, key_padding_mask=keys == nb.PAD, average_attn_weights=False)
        elif case == "self-causal":
            out = ours(x, causal=True)
            ref, ref_w = theirs(x, x, x, attn_mask=torch_causal(6), average_attn_weights=False)
        else:
            keys = tokens([5, 3, 1], 5, seed=12)
            out = ours(x, memory, mask=nb.padding_mask(keys))
            ref, ref_w = theirs(x, memory, memory, key_padding_mask=keys == nb.PAD, average_attn_weights=False)
    torch.testing.assert_close(out, ref, **TOL)
    torch.testing.assert_close(ours.weights, ref_w, **TOL)


@pytest.mark.parametrize("case", ["padding", "causal", "cross-padding"])
def test_sdpa_equals_the_written_out_attention(nb: types.ModuleType, case: str) -> None:
    """MultiHeadAttention's fused step 2 (SDPA) gives the output of section 5.2's attention() between the same
    projections (step 1) and W^O (step 4), for the same masks."""
    torch.manual_seed(120)
    mha = nb.MultiHeadAttention(D, HEADS, DROPOUT).eval()
    x, memory = torch.randn(3, 6, D), torch.randn(3, 4, D)
    pad_self, pad_mem = nb.padding_mask(tokens([6, 3, 1], 6, seed=121)), nb.padding_mask(tokens([4, 2, 1], 4, seed=122))
    kwargs = {"padding": {"mask": pad_self}, "causal": {"causal": True},
              "cross-padding": {"memory": memory, "mask": pad_mem}}[case]
    mask = nb.causal_mask(6) if kwargs.get("causal") else kwargs["mask"]
    heads, _ = nb.attention(*mha.project(x, kwargs.get("memory")), mask)
    torch.testing.assert_close(mha(x, **kwargs), mha.out_proj(heads.transpose(1, 2).flatten(2)), **TOL)


def test_dropout_on_attention_weights(nb: types.ModuleType) -> None:
    """With attention dropout as the only dropout, train mode drops attention weights (two calls differ); eval mode
    keeps the plain softmax."""
    torch.manual_seed(100)
    mha = nb.MultiHeadAttention(D, HEADS, dropout=0.5)
    x = torch.randn(2, 8, D)
    mha.train()
    assert not torch.allclose(mha(x), mha(x), atol=1e-4)  # dropout_p is active in train mode
    mha.eval()
    torch.testing.assert_close(mha(x), mha(x), atol=0.0, rtol=0.0)


def test_mha_forward_reads_as_the_paper(nb: types.ModuleType) -> None:
    """MultiHeadAttention.forward, def line to return with its docstring, fits in 25 lines and shows the paper's
    four steps, numbered. Costs nothing: it reads the source of the module the other tests use."""
    import linecache

    from nbloader import NOTEBOOK, code_cells

    for index, source in enumerate(code_cells()):  # the names load_notebook compiled the cells under
        linecache.cache[f"{NOTEBOOK.name}:code cell {index}"] = (len(source), None, source.splitlines(True), "")
    forward = inspect.getsource(nb.MultiHeadAttention.forward).rstrip("\n").splitlines()
    assert len(forward) <= 25, f"MultiHeadAttention.forward has {len(forward)} lines, over 25: fold the plumbing"
    steps = [line.strip() for line in forward if re.match(r"\s*# [1-4]\. ", line)]
    assert [step[:4] for step in steps] == ["# 1.", "# 2.", "# 3.", "# 4."], steps


def test_the_cache_takes_over_step_1_and_the_layers_keep_nothing(nb: types.ModuleType, model: nn.Module) -> None:
    """Decoding with a DecoderCache, each attention layer hands step 1 (the projection) to its KVCache once a step,
    and keeps no state of its own: its attributes, parameters and buffers are those it had before; the keys and values
    are in the cache (section 10)."""
    layers = [m for m in model.modules() if isinstance(m, nb.MultiHeadAttention)]
    before = [({k: v for k, v in vars(m).items() if not k.startswith("_")}, list(m.named_buffers())) for m in layers]
    cache, calls = nb.DecoderCache(model), []
    for self_kv, cross_kv in cache.layers:
        for kv in (self_kv, cross_kv):
            real = kv.project
            kv.project = lambda *args, _real=real, **kwargs: calls.append(1) or _real(*args, **kwargs)
    src, tgt_in = tokens([7, 3], 7, seed=132), tokens([4, 4], 4, seed=133, bos=True)
    with torch.no_grad():
        memory, src_mask = model.encode(src)
        for t in range(tgt_in.size(1)):
            model.decode(tgt_in[:, t: t + 1], memory, src_mask, cache)
    assert len(calls) == tgt_in.size(1) * 2 * LAYERS  # self- and cross-attention of each layer, each step
    after = [({k: v for k, v in vars(m).items() if not k.startswith("_")}, list(m.named_buffers())) for m in layers]
    assert after == before
    assert len(cache) == 4 and all(kv.k is not None for pair in cache.layers for kv in pair)


# ---------------------------------------------------------------- 5.9 the model answers its own limit
def test_the_model_refuses_more_positions_than_its_table(nb: types.ModuleType) -> None:
    """The positional table's length comes from the config (no default of the class), and the model checks it where
    positions are read (Transformer.embed): a longer source, or a decoding step past the table, raises a ValueError
    that names the fix, not an index or shape error deep in the model."""
    assert inspect.signature(nb.Transformer).parameters["max_positions"].default is inspect.Parameter.empty
    model = nb.build_model(nb.make_config("smoke", max_positions=24, max_len=16, max_extra_len=5), VOCAB).eval()
    assert model.positions.shape == (24, nb.cfg.d_model)
    with torch.no_grad():
        model(tokens([24], 24, seed=134), tokens([24], 24, seed=135, bos=True))  # as long as the table: fine
        with pytest.raises(ValueError, match="too long: 25 positions, the model has 24.*max_positions"):
            model(tokens([25], 25, seed=136), tokens([3], 3, seed=137, bos=True))
        memory, src_mask = model.encode(tokens([5], 5, seed=138))
        cache, tgt = nb.DecoderCache(model), tokens([25], 25, seed=139, bos=True)
        for t in range(24):  # a decoder with a cache reads position len(cache): the 25th step, position 24, is past it
            model.decode(tgt[:, t: t + 1], memory, src_mask, cache)
        with pytest.raises(ValueError, match="too long: 25 positions"):
            model.decode(tgt[:, 24:], memory, src_mask, cache)


# ---------------------------------------------------------------- 5.6 dropout, and the post-norm residual
def test_cpu_dropout_has_dropouts_distribution(nb: types.ModuleType) -> None:
    """nb.FastDropout on a CPU: each entry is 0 or x / (1 - p); the kept share is 1 - p within 5 standard deviations;
    the gradient is the mask / (1 - p); the mask is uniform >= p; eval mode and p = 0 are the identity."""
    p, n = 0.3, 400_000
    drop = nb.FastDropout(p)
    assert isinstance(drop, nn.Dropout)
    x = (torch.rand(n) + 1.0).requires_grad_()  # no zeros of its own
    torch.manual_seed(150)
    out = drop(x)
    kept = out != 0
    torch.testing.assert_close(out[kept], x[kept] / (1 - p), **TOL)
    assert abs(kept.float().mean().item() - (1 - p)) < 5 * math.sqrt(p * (1 - p) / n)
    out.sum().backward()
    torch.testing.assert_close(x.grad, kept.float() / (1 - p), **TOL)
    torch.manual_seed(150)
    assert torch.equal(kept, torch.rand(n) >= p)
    assert torch.equal(drop.eval()(x), x) and torch.equal(nb.FastDropout(0.0)(x), x)


def test_cpu_dropout_keeps_dtype_and_edge_cases(nb: types.ModuleType) -> None:
    """Like nn.Dropout: a bf16 input stays bf16, p = 1 gives zeros, and inplace=True works in place."""
    x = torch.ones(1000, dtype=torch.bfloat16)
    assert nb.FastDropout(0.5)(x).dtype == torch.bfloat16
    assert not nb.FastDropout(1.0)(torch.ones(10)).any()
    y = torch.ones(1000)
    out = nb.FastDropout(0.5, inplace=True)(y)
    assert out.data_ptr() == y.data_ptr() and not y.all()


def test_post_norm_residual(nb: types.ModuleType) -> None:
    """PostNormResidual(x, sublayer) = LayerNorm(x + Dropout(sublayer(x))): the sub-layer reads x itself, dropout hits
    its output only, then the norm."""
    torch.manual_seed(110)
    res = nb.PostNormResidual(D, dropout=0.5)
    randomize_norms(res, seed=111)
    x, s, read = torch.randn(2, 5, D), torch.randn(2, 5, D), []

    def sublayer(given: torch.Tensor) -> torch.Tensor:
        read.append(given)
        return s

    res.eval()
    torch.testing.assert_close(res(x, sublayer), res.norm(x + s), **TOL)
    assert read and read[0] is x
    res.train()
    torch.testing.assert_close(res(x, torch.zeros_like), res.norm(x), **TOL)  # the residual path is not dropped
    assert not torch.allclose(res(x, sublayer), res(x, sublayer), atol=1e-3)


# ---------------------------------------------------------------- 5.7 and 5.8 the encoder and decoder layers
def test_encoder_layer_matches_torch(nb: types.ModuleType) -> None:
    """EncoderLayer == nn.TransformerEncoderLayer(relu, post-norm) with a source key-padding mask."""
    torch.manual_seed(20)
    ours = nb.EncoderLayer(D, HEADS, D_FF, DROPOUT)
    randomize_norms(ours, seed=21)
    theirs = nn.TransformerEncoderLayer(D, HEADS, D_FF, DROPOUT, activation="relu", batch_first=True,
                                        norm_first=False)
    load_encoder_layer(theirs, ours)
    ours.eval(), theirs.eval()
    x, src = torch.randn(3, 7, D), tokens([7, 5, 2], 7, seed=22)
    out = ours(x, nb.padding_mask(src))
    ref = theirs(x, src_key_padding_mask=src == nb.PAD)
    torch.testing.assert_close(out, ref, **TOL)


def test_decoder_layer_matches_torch(nb: types.ModuleType) -> None:
    """DecoderLayer == nn.TransformerDecoderLayer(post-norm) with a causal target mask and memory key padding."""
    torch.manual_seed(30)
    ours = nb.DecoderLayer(D, HEADS, D_FF, DROPOUT)
    randomize_norms(ours, seed=31)
    theirs = nn.TransformerDecoderLayer(D, HEADS, D_FF, DROPOUT, activation="relu", batch_first=True,
                                        norm_first=False)
    load_decoder_layer(theirs, ours)
    ours.eval(), theirs.eval()
    y, memory, src = torch.randn(3, 6, D), torch.randn(3, 5, D), tokens([5, 3, 1], 5, seed=32)
    out = ours(y, memory, nb.padding_mask(src))
    ref = theirs(y, memory, tgt_mask=torch_causal(6), memory_key_padding_mask=src == nb.PAD)
    torch.testing.assert_close(out, ref, **TOL)


# ---------------------------------------------------------------- 5.9 the whole model
def test_transformer_matches_torch(nb: types.ModuleType, model: nn.Module) -> None:
    """The whole model == nn.Transformer fed the same embeddings, with logits from the tied embedding matrix."""
    torch.manual_seed(40)
    theirs = nn.Transformer(D, HEADS, LAYERS, LAYERS, D_FF, DROPOUT, batch_first=True, norm_first=False)
    # nn.Transformer ends its encoder and its decoder with an extra LayerNorm. That final norm belongs to the
    # pre-norm variant; in the paper's post-norm every sub-layer already ends in a LayerNorm and there is none.
    theirs.encoder.norm = nn.Identity()
    theirs.decoder.norm = nn.Identity()
    for t, o in zip(theirs.encoder.layers, model.encoder, strict=True):
        load_encoder_layer(t, o)
    for t, o in zip(theirs.decoder.layers, model.decoder, strict=True):
        load_decoder_layer(t, o)
    theirs.eval()
    src, tgt_in = tokens([7, 4, 2], 7, seed=41), tokens([6, 6, 3], 6, seed=42, bos=True)
    out = model(src, tgt_in)
    hidden = theirs(model.embed(src), model.embed(tgt_in), tgt_mask=torch_causal(6),
                    src_key_padding_mask=src == nb.PAD, memory_key_padding_mask=src == nb.PAD)
    torch.testing.assert_close(out, F.linear(hidden, model.embedding.weight), **TOL)


def test_future_targets_do_not_change_past_logits(nb: types.ModuleType, model: nn.Module) -> None:
    """Causality: changing target tokens after position t leaves the logits at positions <= t unchanged."""
    src, tgt_in = tokens([7, 5], 7, seed=50), tokens([8, 8], 8, seed=51, bos=True)
    base = model(src, tgt_in)
    for t in (0, 3, 6):
        changed = tgt_in.clone()
        changed[:, t + 1:] = tokens([7 - t, 7 - t], 7 - t, seed=52 + t)
        assert not torch.equal(changed, tgt_in)
        out = model(src, changed)
        torch.testing.assert_close(out[:, : t + 1], base[:, : t + 1], **TOL)
        assert not torch.allclose(out[:, t + 1:], base[:, t + 1:], atol=1e-3)  # the future did change


def test_source_padding_does_not_change_logits(nb: types.ModuleType, model: nn.Module) -> None:
    """Appending <pad> tokens to the source leaves every logit unchanged."""
    src, tgt_in = tokens([6, 4], 6, seed=60), tokens([5, 5], 5, seed=61, bos=True)
    padded = torch.cat([src, torch.full((2, 5), nb.PAD)], 1)
    torch.testing.assert_close(model(padded, tgt_in), model(src, tgt_in), **TOL)


def test_target_padding_does_not_change_logits(nb: types.ModuleType, model: nn.Module) -> None:
    """Appending <pad> tokens to the target leaves the logits at the original positions unchanged."""
    src, tgt_in = tokens([6, 4], 6, seed=62), tokens([5, 3], 5, seed=63, bos=True)
    padded = torch.cat([tgt_in, torch.full((2, 4), nb.PAD)], 1)
    torch.testing.assert_close(model(src, padded)[:, :5], model(src, tgt_in), **TOL)


def test_embeddings_are_tied(nb: types.ModuleType, model: nn.Module) -> None:
    """Source embedding, target embedding and output projection are one Parameter, counted once."""
    E = model.embedding.weight
    assert [p for p in model.parameters() if p.shape == (VOCAB, D)] == [E]
    mha, ffn, norm = 4 * D * D + 4 * D, 2 * D * D_FF + D_FF + D, 2 * D
    expected = VOCAB * D + LAYERS * (mha + ffn + 2 * norm) + LAYERS * (2 * mha + ffn + 3 * norm)
    assert sum(p.numel() for p in model.parameters()) == expected

    # ids 3..9 in the source, 10..19 in the target; 20.. appear nowhere
    src, tgt_in = tokens([6, 4], 6, seed=70, low=3, high=10), tokens([5, 5], 5, seed=71, low=10, high=20, bos=True)
    captured = {}
    model.decoder[-1].register_forward_hook(lambda module, args, out: captured.update(hidden=out))
    logits = model(src, tgt_in)
    torch.testing.assert_close(logits, captured["hidden"] @ E.T, **TOL)  # output projection = E
    memory = model.encode(src)[0]
    with torch.no_grad():
        E[25] += 1.0  # a token in neither sentence: only its own logit column moves
    new = model(src, tgt_in)
    torch.testing.assert_close(new[..., :25], logits[..., :25], **TOL)
    torch.testing.assert_close(new[..., 26:], logits[..., 26:], **TOL)
    assert not torch.allclose(new[..., 25], logits[..., 25], atol=1e-3)
    with torch.no_grad():
        E[src[0, 0]] += 1.0  # a source-only token: the encoder input is E too
    assert not torch.allclose(model.encode(src)[0], memory, atol=1e-3)
    before = model(src, tgt_in)
    with torch.no_grad():
        E[tgt_in[0, 1]] += 1.0  # a target-only token: the decoder input is E too
    assert not torch.allclose(model(src, tgt_in)[0, 1:], before[0, 1:], atol=1e-3)


def test_the_output_projection_trains_the_shared_matrix(nb: types.ModuleType) -> None:
    """The logits are o E^T with the E that embeds the tokens, and their gradient reaches E: also the row of a token
    that is never read, which only the output projection uses. A projection by a detached E passes the parity tests
    against nn.Transformer but not this."""
    model = nb.build_model(nb.cfg, nb.VOCAB)
    unread = 9
    logits = model(torch.tensor([[5, 6, nb.EOS]]), torch.tensor([[nb.BOS, 7]]))
    logits[..., unread].sum().backward()
    assert float(model.embedding.weight.grad[unread].abs().sum()) > 0


def test_embedding_scaled_by_sqrt_d_model(nb: types.ModuleType, model: nn.Module) -> None:
    """In eval mode embed(tokens, offset) = E[tokens] * sqrt(d_model) + PE[offset : offset + T]."""
    x = tokens([5, 3], 5, seed=80)
    table = nb.sinusoidal_positions(MAX_POS, D)
    torch.testing.assert_close(model.positions, table, atol=0.0, rtol=0.0)
    for offset in (0, 7):
        expected = model.embedding.weight[x] * math.sqrt(D) + table[offset: offset + 5]
        torch.testing.assert_close(model.embed(x, offset), expected, **TOL)


def test_dropout_only_in_train_mode(nb: types.ModuleType, model: nn.Module) -> None:
    """Two training-mode forwards differ (dropout is on); two eval-mode forwards are identical."""
    src, tgt_in = tokens([6, 4], 6, seed=90), tokens([5, 5], 5, seed=91, bos=True)
    torch.manual_seed(92)
    model.train()
    assert not torch.allclose(model(src, tgt_in), model(src, tgt_in), atol=1e-3)
    model.eval()
    assert torch.equal(model(src, tgt_in), model(src, tgt_in))


def test_dropout_after_embedding_plus_position(model: nn.Module) -> None:
    """embed() in train mode is Dropout(E[x] sqrt(d) + PE): entries are 0 or the eval value / (1 - p)."""
    x = tokens([20, 20], 20, seed=95)
    reference = model.embed(x)
    torch.manual_seed(96)
    model.train()
    out = model.embed(x)
    dropped = out == 0
    assert dropped.any() and not dropped.all()
    torch.testing.assert_close(out[~dropped], reference[~dropped] / (1 - DROPOUT), **TOL)


def test_dropout_placement_in_the_full_model(nb: types.ModuleType) -> None:
    """build_model has exactly the paper's dropouts (paper §5.4), each with p = cfg.dropout: one on embeddings + positions
    (a single module, applied to the source and to the target), 2 residual per encoder layer and 3 per decoder
    layer. The attention layers' dropout on their weights has p = cfg.attention_dropout, 0 by default (not the
    paper's; tensor2tensor added it later): 1 + 3 * 3 + 5 * 2 = 20 modules here. With all of them set to p = 0 the
    model in train mode equals eval mode: there is no dropout anywhere else."""
    enc, dec = 3, 2
    assert nb.build_model(nb.make_config("smoke", dropout=0.3), VOCAB).encoder[0].self_attn.attn_dropout.p == 0.0
    cfg = nb.make_config("smoke", encoder_layers=enc, decoder_layers=dec, dropout=0.3, attention_dropout=0.2)
    model = nb.build_model(cfg, VOCAB)
    where: dict[str, list[str]] = {}
    for name, module in model.named_modules():
        for child_name, child in module.named_children():
            if isinstance(child, nn.Dropout):
                p = cfg.attention_dropout if isinstance(module, nb.MultiHeadAttention) else cfg.dropout
                kind = nn.Dropout if isinstance(module, nb.MultiHeadAttention) else nb.FastDropout
                assert type(child) is kind and child.p == p, f"{name}.{child_name}: {type(child)}, p={child.p}"
                where.setdefault(type(module).__name__, []).append(child_name)
    n_attention, n_residual = enc + 2 * dec, 2 * enc + 3 * dec
    assert {kind: len(names) for kind, names in where.items()} == {
        "Transformer": 1, "MultiHeadAttention": n_attention, "PostNormResidual": n_residual}
    assert sum(isinstance(m, nn.Dropout) for m in model.modules()) == 1 + 3 * enc + 5 * dec == 20
    assert sum(isinstance(m, nb.MultiHeadAttention) for m in model.modules()) == n_attention
    assert sum(isinstance(m, nb.PostNormResidual) for m in model.modules()) == n_residual

    src, tgt_in = tokens([6, 4], 6, seed=140), tokens([5, 5], 5, seed=141, bos=True)
    torch.manual_seed(142)
    model.train()
    assert not torch.allclose(model(src, tgt_in), model(src, tgt_in), atol=1e-3)
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
    train_out = model.train()(src, tgt_in)
    torch.testing.assert_close(train_out, model.eval()(src, tgt_in), **TOL)


def test_kv_cache_matches_full_decode(nb: types.ModuleType, model: nn.Module) -> None:
    """Decoding one token at a time with a key/value cache gives the teacher-forced logits at every step."""
    src, tgt_in = tokens([7, 3], 7, seed=130), tokens([6, 6], 6, seed=131, bos=True)
    with torch.no_grad():
        memory, src_mask = model.encode(src)
        full = model.decode(tgt_in, memory, src_mask)
        cache = nb.DecoderCache(model)
        steps = [model.decode(tgt_in[:, t: t + 1], memory, src_mask, cache) for t in range(tgt_in.size(1))]
    torch.testing.assert_close(torch.cat(steps, 1), full, **TOL)
    assert len(cache) == 6 and cache.layers[0][0].k.shape == (2, HEADS, 6, D // HEADS)
