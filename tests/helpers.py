"""What several test files share: the repository's paths, the small training set-ups, files written or damaged for a
test, the IWSLT14 slice's lines, and the ways to take the notebook's GPU branches on a CPU.

The notebook itself is imported once per session by the `nb` fixture of conftest.py (through nbloader.py); the
fixtures several files use are there too.
"""

from __future__ import annotations

from pathlib import Path

import torch
from nbloader import NOTEBOOK

ROOT = NOTEBOOK.parent
CPU = torch.device("cpu")
SLICE = ROOT / "tests" / "data" / "multi30k"  # the Multi30k slice kept in the repository
IWSLT14 = ROOT / "tests" / "data" / "iwslt14"  # real IWSLT14 pairs: hub/ (the Hub's text) and tokenized/ (fairseq's)
SPLITS = ("train", "validation", "test")


# ---------------------------------------------------------------- small training set-ups
def small_setup(nb, tmp_path: Path, name: str, checkpoint_every_min: float = 1e-9, **overrides):
    """(cfg, model, train batches, validation batches): the smoke model on 120 pairs in small batches, so that a few
    training steps take well under a second. By default a checkpoint is written after every step
    (checkpoint_every_min ~ 0); a test that controls what is written passes 60.0, so that one is written only when
    training stops."""
    settings = {"log_every": 2, "checkpoint_every_min": checkpoint_every_min, "max_tokens": 512, "warmup_steps": 20,
                "time_budget_min": 60.0, **overrides}
    cfg = nb.make_config("smoke", **{"work_dir": str(tmp_path / name), **settings})
    src, tgt = (x[:120] for x in nb.data["train"])
    train = nb.make_batches(src, tgt, cfg.max_tokens)
    valid = nb.make_batches(*(x[:20] for x in nb.data["validation"]), cfg.max_tokens)
    nb.seed_everything(cfg.seed)
    return cfg, nb.build_model(cfg, nb.VOCAB), train, valid


def tiny_setup(nb, tmp_path: Path | str, name: str = "tiny", gpu: bool = False, **overrides):
    """(cfg, model, batch): a d 32, 1+1-layer model and one batch of 12 training pairs, seeded; gpu: the batch padded
    as for a GPU (lengths to multiples of 8)."""
    settings = {"d_model": 32, "d_ff": 64, "n_heads": 2, "encoder_layers": 1, "decoder_layers": 1,
                "warmup_steps": 10, "max_tokens": 512, "log_every": 2, "max_extra_len": 10, **overrides}
    cfg = nb.make_config("smoke", work_dir=str(Path(tmp_path) / name), **settings)
    batches = nb.make_batches(*(x[:12] for x in nb.data["train"]), cfg.max_tokens, gpu)
    assert len(batches) == 1
    nb.seed_everything(cfg.seed)
    return cfg, nb.build_model(cfg, nb.VOCAB), batches[0]


# ---------------------------------------------------------------- the GPU's branches, taken on a CPU
# No GPU is needed: `make_batches(..., gpu=True)` pads as for a GPU, `torch.autocast("cpu", dtype=...)` and `torch.amp.GradScaler("cpu")` stand in for their CUDA versions, and
# `autocast_dtype` is replaced by one that answers as a GPU would. The tiny model keeps this to seconds:
# low-precision matrix products are slow on a CPU.
STEPS = 6  # training steps of each dtype, all on the same batch
LOW_PRECISION = {"fp16": torch.float16, "bf16": torch.bfloat16}


def as_on_a_gpu(dtype: torch.dtype):
    """An autocast_dtype that answers as on a GPU whose training autocast dtype is `dtype`."""
    return lambda device, enabled=True: dtype if enabled else None


def train_tiny(nb, tmp_path, amp_dtype: torch.dtype | None) -> dict:
    """STEPS steps of the notebook's train_step on the GPU path; the losses per token and what the step used."""
    cfg, model, batch = tiny_setup(nb, tmp_path, gpu=True)
    optimizer, scaler = nb.make_optimizer(model, cfg), torch.amp.GradScaler("cpu")
    seen = []

    def forward(src, tgt_in):
        seen.append(torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None)
        return model(src, tgt_in)

    nb.seed_everything(cfg.seed)  # the same dropout masks in every dtype
    losses = [nb.train_step(forward, batch, optimizer, scaler, amp_dtype, cfg, step).item() / batch.n_tokens
              for step in range(1, STEPS + 1)]
    return {"losses": losses, "seen": seen, "optimizer": optimizer, "scaler": scaler, "model": model, "cfg": cfg}


# ---------------------------------------------------------------- files written, damaged or read back by a test
def write_split(folder: Path, split: str, de: list[str], en: list[str]) -> None:
    """folder/{split}.de and .en, one sentence per line, UTF-8, each line ended by '\\n'."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{split}.de").write_text("".join(line + "\n" for line in de), encoding="utf-8")
    (folder / f"{split}.en").write_text("".join(line + "\n" for line in en), encoding="utf-8")


def truncate_to_half(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def saved_step(path: Path) -> int:
    return torch.load(path, map_location="cpu", weights_only=False)["state"]["step"]


def tiny_weights(value: float) -> dict:
    return {"w": torch.full((2,), value), "b": torch.full((1,), -value)}


def messages(record, category=UserWarning) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, category)]


# ---------------------------------------------------------------- the IWSLT14 slice in tests/data/iwslt14
def lines(style: str, split: str, lang: str) -> list[str]:
    return (IWSLT14 / style / f"{split}.{lang}").read_text(encoding="utf-8").split("\n")[:-1]


def every_line(style: str, lang: str) -> list[str]:
    return [line for split in SPLITS for line in lines(style, split, lang)]


# Section 13's first exercise as a student types it into the notebook: the residual class defined again, pre-norm.
PRE_NORM = '''
class PostNormResidual(nn.Module):
    """Section 13's first exercise: x + Dropout(sublayer(LayerNorm(x))), the same parameters wired otherwise."""

    def __init__(self, d_model: int, dropout: float):
        super().__init__()
        self.dropout = nn.Dropout(dropout)  # PyTorch's: the same whatever the notebook names its own
        self.norm = nn.LayerNorm(d_model)

    def forward(self, x, sublayer):
        return x + self.dropout(sublayer(self.norm(x)))
'''
