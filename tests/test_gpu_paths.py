"""Every GPU branch of the notebook, run on a CPU: the padded (unpacked) training step under fp16 and bf16 autocast
with the gradient scaler and fused Adam, a skipped non-finite step, decoding when training uses autocast, resuming
a checkpoint written on a machine with two GPUs, and the dtype section 7's time estimate uses.

No GPU is needed: `batch_loss(..., pack=False)` takes the GPU's way (the padded rectangle) on a CPU,
`torch.autocast("cpu", dtype=...)` and `torch.amp.GradScaler("cpu")` stand in for their CUDA versions, and
`autocast_dtype` is replaced by one that answers as a GPU would. A tiny model (d 32, 1+1 layers, one batch of 12
pairs) keeps the whole file to seconds: low-precision matrix products are slow on a CPU.
"""

from __future__ import annotations

import contextlib
import functools
import math
import zipfile
from pathlib import Path

import pytest
import torch

CPU = torch.device("cpu")
NOTEBOOK = Path(__file__).resolve().parent.parent / "transformer.ipynb"
STEPS = 6  # training steps of each dtype, all on the same batch
# The largest gap between an autocast step's loss per token and the fp32 step's, same weights and dropout masks.
# Measured (torch 2.13 CPU): fp16 0.013, bf16 0.007 nats over the 6 steps; the bound leaves a margin of about 4x.
LOSS_TOLERANCE = 0.05
LOW_PRECISION = {"fp16": torch.float16, "bf16": torch.bfloat16}


def tiny_setup(nb, tmp_path: Path | str, name: str = "tiny", **overrides):
    """(cfg, model, batch): a d 32, 1+1-layer model and one batch of 12 training pairs, seeded."""
    settings = {"d_model": 32, "d_ff": 64, "n_heads": 2, "encoder_layers": 1, "decoder_layers": 1,
                "warmup_steps": 10, "max_tokens": 512, "log_every": 2, "max_extra_len": 10, **overrides}
    cfg = nb.make_config("smoke", work_dir=str(Path(tmp_path) / name), **settings)
    batches = nb.make_batches(*(x[:12] for x in nb.data["train"]), cfg.max_tokens)
    assert len(batches) == 1
    nb.seed_everything(cfg.seed)
    return cfg, nb.build_model(cfg, nb.VOCAB), batches[0]


@contextlib.contextmanager
def gpu_path(nb):
    """batch_loss keeps the padded rectangle, as it does on a GPU (train_step and validation_loss call it)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(nb, "batch_loss", functools.partial(nb.batch_loss, pack=False))
        yield


def as_on_a_gpu(dtype: torch.dtype):
    """An autocast_dtype that answers as on a GPU whose training autocast dtype is `dtype`."""
    return lambda device, enabled=True: dtype if enabled else None


def train_tiny(nb, tmp_path, amp_dtype: torch.dtype | None) -> dict:
    """STEPS steps of the notebook's train_step on the GPU path; the losses per token and what the step used."""
    cfg, model, batch = tiny_setup(nb, tmp_path)
    optimizer, scaler = nb.make_optimizer(model, cfg), torch.amp.GradScaler("cpu")
    seen = []

    def forward(src, tgt_in, real=None):
        seen.append((real, torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None))
        return model(src, tgt_in, real)

    nb.seed_everything(cfg.seed)  # the same dropout masks in every dtype
    with gpu_path(nb):
        losses = [nb.train_step(forward, batch, optimizer, scaler, amp_dtype, cfg, step).item() / batch.n_tokens
                  for step in range(1, STEPS + 1)]
    return {"losses": losses, "seen": seen, "optimizer": optimizer, "scaler": scaler, "model": model, "cfg": cfg}


@pytest.fixture(scope="module")
def fp32_run(nb, tmp_path_factory):
    return train_tiny(nb, tmp_path_factory.mktemp("fp32"), None)


# ---------------------------------------------------------------------------------------------------------------------
# the training step


@pytest.mark.parametrize("name", LOW_PRECISION)
def test_gpu_training_step_under_autocast_with_scaler_and_fused_adam(nb, tmp_path, fp32_run, name):
    """The padded step under fp16 / bf16 autocast, scaled, with fused Adam: finite, the loss falling, every step within
    LOSS_TOLERANCE of the fp32 step, and no step skipped (the initial scale, 2^16, does not overflow here)."""
    run = train_tiny(nb, tmp_path, LOW_PRECISION[name])
    assert all(real is None for real, _ in run["seen"]), "the padding was skipped: that is the CPU path, not the GPU's"
    assert {dtype for _, dtype in run["seen"]} == {LOW_PRECISION[name]}
    assert run["optimizer"].defaults["fused"] and run["scaler"].is_enabled()
    losses, reference = run["losses"], fp32_run["losses"]
    assert all(map(math.isfinite, losses)) and nb.weights_are_finite(run["model"])
    assert losses[-1] < losses[0] - 1.0, f"the {name} loss did not fall: {losses}"
    assert reference[-1] < reference[0] - 1.0, f"the fp32 loss did not fall: {reference}"
    gap = max(abs(a - b) for a, b in zip(losses, reference, strict=True))
    assert gap < LOSS_TOLERANCE, f"{name} vs fp32, loss per token: {losses} vs {reference}"
    adam_steps = {int(s["step"]) for s in run["optimizer"].state.values()}
    assert adam_steps == {STEPS} and run["scaler"].get_scale() == 2.0**16  # every step applied, no overflow


def test_gpu_path_is_the_padded_rectangle_and_matches_the_packed_loss(nb, tmp_path):
    """pack=False gives the model the rectangle (real=None); its loss equals the packed one (eval mode)."""
    _, model, batch = tiny_setup(nb, tmp_path)
    model.eval()
    with torch.no_grad():
        padded = torch.stack(nb.batch_loss(model, batch, 0.1, pack=False))
        packed = torch.stack(nb.batch_loss(model, batch, 0.1, pack=True))
        default = torch.stack(nb.batch_loss(model, batch, 0.1))  # on a CPU: packed
    torch.testing.assert_close(padded, packed, rtol=1e-5, atol=1e-4)
    assert torch.equal(default, packed)


def test_non_finite_gradient_on_the_gpu_path_is_skipped_counted_and_reported(nb, tmp_path, capsys):
    """fp16 autocast, scaler, fused Adam, padded batches: a step whose gradients overflow (its loss is finite) leaves
    the weights and Adam's state untouched and halves the scale; LossWindow counts it in TrainState.skipped_steps
    and prints it; the next step updates again."""
    cfg, model, batch = tiny_setup(nb, tmp_path)
    optimizer, scaler = nb.make_optimizer(model, cfg), torch.amp.GradScaler("cpu")
    state, window, backward_calls = nb.TrainState(), nb.LossWindow(CPU), []

    def overflow_on_the_third_backward(grad):
        backward_calls.append(1)
        return grad * float("inf") if len(backward_calls) == 3 else grad

    model.embedding.weight.register_hook(overflow_on_the_third_backward)

    def step():
        loss = nb.train_step(model, batch, optimizer, scaler, torch.float16, cfg, state.step + 1)
        window.add(loss, batch.n_tokens)
        state.step += 1
        return loss

    with gpu_path(nb):
        step(), step()
        weights = {k: v.clone() for k, v in model.state_dict().items()}
        adam = {id(p): {k: v.clone() for k, v in s.items()} for p, s in optimizer.state.items()}
        scale = scaler.get_scale()
        assert torch.isfinite(step())  # the loss is finite: only the gradients overflowed
        assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items()), "the skipped step moved weights"
        for p, s in optimizer.state.items():
            assert all(torch.equal(adam[id(p)][k], v) for k, v in s.items()), "the skipped step changed Adam's state"
        assert scaler.get_scale() == scale / 2
        capsys.readouterr()
        window.read(state, optimizer)
        assert state.skipped_steps == 1
        report = capsys.readouterr().out
        assert "step 3: 1 step(s) skipped" in report and "(1 so far" in report, report
        step()
        assert not all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
        window.read(state, optimizer)
    assert state.skipped_steps == 1 and "skipped" not in capsys.readouterr().out  # no new skip, no new report
    assert len(state.history["train_loss"]) == 2 and all(map(math.isfinite, state.history["train_loss"]))


# ---------------------------------------------------------------------------------------------------------------------
# decoding


@pytest.mark.parametrize("name", LOW_PRECISION)
def test_decoding_runs_in_fp32_when_training_uses_autocast(nb, monkeypatch, fp32_run, name):
    """On a GPU whose training runs under fp16 / bf16 autocast, decode_corpus (greedy and beam) decodes in fp32:
    no autocast inside greedy_decode / beam_search, and the outputs are the fp32 ones."""
    model, cfg = fp32_run["model"], fp32_run["cfg"]
    texts = nb.corpus["test"][0][:4]
    expected = {beam: nb.decode_corpus(model, nb.tokenizer, texts, cfg, CPU, beam) for beam in (1, 3)}
    autocast_seen = []

    def recording(decoder):
        def run(*args, **kwargs):
            autocast_seen.append(torch.is_autocast_enabled("cpu"))
            return decoder(*args, **kwargs)
        return run

    monkeypatch.setattr(nb, "greedy_decode", recording(nb.greedy_decode))
    monkeypatch.setattr(nb, "beam_search", recording(nb.beam_search))
    monkeypatch.setattr(nb, "autocast_dtype", as_on_a_gpu(LOW_PRECISION[name]))
    for beam in (1, 3):
        assert nb.decode_corpus(model, nb.tokenizer, texts, cfg, CPU, beam) == expected[beam]
    assert autocast_seen and not any(autocast_seen), "decoding ran under autocast"


# ---------------------------------------------------------------------------------------------------------------------
# checkpoints written on a GPU machine


@contextlib.contextmanager
def storages_tagged(location: str):
    """Inside the block torch.save records every storage as living on `location` (e.g. "cuda:0"), as it does for
    CUDA tensors: a file like one written on a GPU, without a GPU."""
    tagger = lambda storage: location
    torch.serialization.register_package(-100, tagger, lambda storage, loc: None)
    try:
        yield
    finally:
        torch.serialization._package_registry[:] = [e for e in torch.serialization._package_registry
                                                    if e[1] is not tagger]


class FakeCudaGenerator:
    def __init__(self):
        self.states = []

    def set_state(self, state):
        self.states.append(state.clone())


@contextlib.contextmanager
def cuda_machine(monkeypatch, devices: int):
    """torch.cuda as on a machine with `devices` GPUs, as far as the random generators go: torch's own
    set_rng_state runs, against `devices` generators (set_rng_state_all of a longer list raises IndexError)."""
    generators = tuple(FakeCudaGenerator() for _ in range(devices))
    with monkeypatch.context() as patch:
        patch.setattr(torch.cuda, "is_available", lambda: True)
        patch.setattr(torch.cuda, "device_count", lambda: devices)
        patch.setattr(torch.cuda, "default_generators", generators)
        patch.setattr(torch.cuda.random, "is_initialized", lambda: True)
        patch.setattr(torch.cuda.random, "current_device", lambda: 0)
        patch.setattr(torch.cuda.random, "_lazy_call", lambda callback, **kwargs: callback())
        yield generators


def write_gpu_checkpoint(nb, tmp_path, monkeypatch):
    """A checkpoint as a 2-GPU machine writes it: every storage tagged cuda:0, rng["cuda"] a list of 2 states."""
    cfg, model, batch = tiny_setup(nb, tmp_path, "gpu-ckpt")
    optimizer, scaler = nb.make_optimizer(model, cfg), torch.amp.GradScaler("cpu")
    with gpu_path(nb):
        for step in (1, 2):
            nb.train_step(model, batch, optimizer, scaler, torch.float16, cfg, step)
    cuda_states = [torch.arange(16, dtype=torch.uint8), torch.arange(16, 32, dtype=torch.uint8)]
    path = Path(cfg.work_dir) / "checkpoints" / "last.pt"
    with storages_tagged("cuda:0"), monkeypatch.context() as patch:
        patch.setattr(torch.cuda, "is_available", lambda: True)
        patch.setattr(torch.cuda, "get_rng_state_all", lambda: [s.clone() for s in cuda_states])
        assert nb.save_checkpoint(path, model, optimizer, scaler, nb.TrainState(step=2, epoch=1), {"data": "x"})
    with zipfile.ZipFile(path) as archive:
        pickled = archive.read(next(n for n in archive.namelist() if n.endswith("data.pkl")))
    assert b"cuda:0" in pickled and b"cpu" not in pickled, "the storages are not tagged as CUDA storages"
    with pytest.raises(RuntimeError, match="CUDA"):  # without map_location a CPU cannot read it
        torch.load(path, weights_only=False)
    return cfg, model, optimizer, batch, path, cuda_states


@pytest.mark.parametrize("gpus", [0, 1, 2])
def test_checkpoint_from_a_two_gpu_machine_resumes_here(nb, tmp_path, monkeypatch, gpus):
    """A checkpoint with CUDA-tagged storages and the random states of 2 GPUs resumes on a CPU-only machine and on
    machines with 1 or 2 GPUs (simulated): weights, Adam's state and step restored, GPU 0's random state restored
    (the notebook trains on one device), and training goes on."""
    cfg, model, _, batch, path, cuda_states = write_gpu_checkpoint(nb, tmp_path, monkeypatch)
    nb.seed_everything(99)
    again = nb.build_model(cfg, nb.VOCAB)
    again_optimizer, again_scaler = nb.make_optimizer(again, cfg), torch.amp.GradScaler("cpu", init_scale=1.0)
    with cuda_machine(monkeypatch, gpus) if gpus else contextlib.nullcontext(()) as generators:
        state = nb.resume(path.parent, again, again_optimizer, again_scaler, {"data": "x"})
    assert (state.step, state.epoch) == (2, 1)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values(), strict=True))
    assert all(t.device == CPU for s in again_optimizer.state.values() for t in s.values())
    assert {int(s["step"]) for s in again_optimizer.state.values()} == {2}
    assert again_scaler.get_scale() == 2.0**16
    if gpus:
        assert [len(g.states) for g in generators] == [1] + [0] * (gpus - 1)  # GPU 0's state, on GPU 0 only
        assert torch.equal(generators[0].states[0], cuda_states[0])
    with gpu_path(nb):
        loss = nb.train_step(again, batch, again_optimizer, again_scaler, torch.float16, cfg, 3)
    assert torch.isfinite(loss) and {int(s["step"]) for s in again_optimizer.state.values()} == {3}


# ---------------------------------------------------------------------------------------------------------------------
# section 7's time estimate


def test_time_estimate_times_the_dtype_training_uses(nb, monkeypatch):
    """Section 7's estimate (seconds_per_step) times training passes under the autocast dtype training will use
    (autocast_dtype), not fp16 everywhere. Run here with an autocast_dtype that answers bf16, as on an Ampere GPU."""
    asked, batch_loss = [], nb.batch_loss

    def recording_batch_loss(forward, batch, eps, amp_dtype=None, pack=None):
        asked.append(amp_dtype)
        return batch_loss(forward, batch, eps, None, pack)  # fp32 here: the test only asks which dtype was chosen

    monkeypatch.setattr(nb, "batch_loss", recording_batch_loss)
    monkeypatch.setattr(nb, "autocast_dtype", as_on_a_gpu(torch.bfloat16))
    model = nb.build_model(nb.cfg, nb.VOCAB)
    seconds = nb.seconds_per_step(model, nb.train_batches[0], nb.cfg, CPU)
    assert seconds >= 0 and all(p.grad is None for p in model.parameters())  # no gradients left behind
    assert asked == [torch.bfloat16] * 3
