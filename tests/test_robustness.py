"""Never lose a run, never give a silent wrong result: resuming, checkpoints, the time budget, the
non-finite guard, chunked decoding, and a clear error for every kind of bad input."""

from __future__ import annotations

import math
import sys
import types
import warnings
from pathlib import Path

import pytest
import torch

SLICE = Path(__file__).resolve().parent / "data" / "multi30k"


# ---------------------------------------------------------------- bad input gets a clear error
def test_unknown_preset_names_the_choices(nb):
    with pytest.raises(ValueError, match=r"unknown preset 'bogus'.*smoke, multi30k, iwslt14.*TRANSFORMER_PRESET"):
        nb.make_config("bogus")


def test_unknown_preset_from_the_environment(nb, monkeypatch):
    monkeypatch.setenv("TRANSFORMER_PRESET", "iwslt15")
    with pytest.raises(ValueError, match="unknown preset 'iwslt15'"):
        nb.make_config()


def test_environment_chooses_preset_data_and_work_dir(nb, monkeypatch, tmp_path):
    monkeypatch.setenv("TRANSFORMER_PRESET", "multi30k")
    monkeypatch.setenv("TRANSFORMER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("TRANSFORMER_WORK_DIR", str(tmp_path / "work"))
    cfg = nb.make_config()
    assert (cfg.preset, cfg.data_dir, cfg.work_dir, cfg.vocab_size) == (
        "multi30k", str(tmp_path / "data"), str(tmp_path / "work"), 8000)


@pytest.mark.parametrize(("overrides", "message"), [
    ({"d_model": 250, "n_heads": 4}, "d_model=250 is not divisible by n_heads=4"),
    ({"d_model": 33, "n_heads": 3}, "must be even"),
    ({"encoder_layers": 0}, "encoder_layers=0 must be at least 1"),
    ({"dropout": 1.0}, "dropout and label_smoothing"),
    ({"max_tokens": 64, "max_len": 128}, "max_tokens=64 cannot hold"),
    ({"dataset": "wmt14"}, "dataset='wmt14' is unknown"),
])
def test_invalid_config_is_refused(nb, overrides, message):
    with pytest.raises(ValueError, match=message):
        nb.make_config("iwslt14", **overrides)


def write_folder(folder: Path, sizes: dict[str, tuple[int, int]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for split, (n_de, n_en) in sizes.items():
        (folder / f"{split}.de").write_text("".join(f"Satz {i}\n" for i in range(n_de)), encoding="utf-8")
        (folder / f"{split}.en").write_text("".join(f"sentence {i}\n" for i in range(n_en)), encoding="utf-8")
    return folder


def test_missing_data_folder(nb, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"does not exist: TRANSFORMER_DATA_DIR must name a folder"):
        nb.read_parallel_folder(tmp_path / "nowhere")


def test_missing_split_file(nb, tmp_path):
    folder = write_folder(tmp_path / "d", {"train": (3, 3), "validation": (2, 2)})
    with pytest.raises(FileNotFoundError, match=r"test\.de is missing"):
        nb.read_parallel_folder(folder)


def test_misaligned_files_name_both_files_and_counts(nb, tmp_path):
    folder = write_folder(tmp_path / "d", {"train": (3, 3), "validation": (5, 4), "test": (2, 2)})
    with pytest.raises(ValueError, match=r"validation\.de has 5 lines but .*validation\.en has 4"):
        nb.read_parallel_folder(folder)


def test_empty_split(nb, tmp_path):
    folder = write_folder(tmp_path / "d", {"train": (3, 3), "validation": (2, 2), "test": (0, 0)})
    with pytest.raises(ValueError, match=r"test\.de and .*test\.en are empty"):
        nb.read_parallel_folder(folder)


def test_folder_lines_are_read_exactly(nb, tmp_path):
    """Split on '\\n' only: a Unicode line separator inside a sentence must not break the alignment."""
    folder = write_folder(tmp_path / "d", {"train": (2, 2), "validation": (1, 1), "test": (1, 1)})
    (folder / "train.de").write_text("a\u2028b\r\n  c \n", encoding="utf-8")
    corpus = nb.read_parallel_folder(folder)
    assert corpus["train"][0] == ["a\u2028b", "  c "]


def test_unreachable_hub_explains_offline_use(nb, monkeypatch):
    def refuse(*args, **kwargs):
        raise ConnectionError("no route to huggingface.co")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=refuse))
    with pytest.raises(ConnectionError, match=r"Hugging Face Hub.*TRANSFORMER_DATA_DIR"):
        nb.load_iwslt14()


def test_iwslt14_loader_falls_back_to_parquet_urls(nb, monkeypatch):
    """If the parquet branch will not load, the parquet files are read by URL; rows become (de, en) lines."""
    calls = []

    def load_dataset(path, revision=None, data_files=None):
        calls.append((path, revision, data_files))
        if path != "parquet":
            raise ValueError("loading scripts are no longer supported")
        return {split: {"translation": [{"de": f"{split} de", "en": f"{split} en"}]} for split in data_files}

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    corpus = nb.load_iwslt14()
    assert calls[0][:2] == ("bbaaaa/iwslt14-de-en", "refs/convert/parquet")
    assert calls[1][2]["test"].endswith("refs%2Fconvert%2Fparquet/de-en/test/0000.parquet")
    assert corpus["validation"] == (["validation de"], ["validation en"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_missing_gpu_warns_and_names_smoke(nb):
    with pytest.warns(UserWarning, match="No GPU found.*TRANSFORMER_PRESET=smoke"):
        device = nb.pick_device(nb.make_config("iwslt14"))
    assert device.type == "cpu"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nb.pick_device(nb.make_config("smoke"))  # the CPU is what smoke is for: no warning


def test_translate_empty_and_overlong_input(nb):
    assert nb.translate("") == ""
    assert nb.translate("   ") == ""
    cfg = nb.make_config("smoke", max_positions=80, max_extra_len=10, decode_max_tokens=4096)
    with pytest.warns(UserWarning, match="longer than 68 tokens were truncated"):
        out = nb.decode_corpus(nb.model, ["Ein Hund läuft. " * 40], cfg, torch.device("cpu"), beam=2)
    assert isinstance(out[0], str)


# ---------------------------------------------------------------- training never loses progress
def small_setup(nb, tmp_path: Path, name: str, **overrides):
    settings = {"log_every": 2, "checkpoint_every_min": 1e-9, "max_tokens": 512, "warmup_steps": 20,
                "time_budget_min": 60.0, **overrides}
    cfg = nb.make_config("smoke", work_dir=str(tmp_path / name), **settings)
    src, tgt = (x[:120] for x in nb.data["train"])
    train = nb.make_batches(src, tgt, cfg.max_tokens)
    valid = nb.make_batches(*(x[:20] for x in nb.data["validation"]), cfg.max_tokens)
    nb.seed_everything(cfg.seed)
    return cfg, nb.build_model(cfg, nb.VOCAB), train, valid


def test_interrupted_and_resumed_run_equals_uninterrupted(nb, tmp_path):
    """Stop after k steps (mid-epoch), resume in a fresh model: the parameters end bit-for-bit equal to an
    uninterrupted run, across an epoch boundary (shuffled order, dropout's random state, Adam's moments)."""
    fingerprint = {"test": 1}
    cfg, model, train, valid = small_setup(nb, tmp_path, "straight")
    n_per_epoch = len(train)
    total, k = n_per_epoch + 3, n_per_epoch // 2
    straight = nb.train(model, train, valid, cfg, torch.device("cpu"), fingerprint, max_steps=total)

    cfg2, model2, _, _ = small_setup(nb, tmp_path, "resumed")
    first = nb.train(model2, train, valid, cfg2, torch.device("cpu"), fingerprint, max_steps=k)
    assert (first.step, first.epoch, first.batch_in_epoch) == (k, 0, k)
    torch.manual_seed(999)  # whatever happens between sessions must not matter
    _, model3, _, _ = small_setup(nb, tmp_path, "resumed")
    resumed = nb.train(model3, train, valid, cfg2, torch.device("cpu"), fingerprint, max_steps=total)
    assert resumed.step == straight.step == total
    assert resumed.history["val_loss"] == straight.history["val_loss"]
    for (name, a), b in zip(model.state_dict().items(), model3.state_dict().values()):
        assert torch.equal(a, b), name


def test_checkpoint_of_other_settings_is_refused(nb, tmp_path):
    cfg, model, train, valid = small_setup(nb, tmp_path, "run")
    nb.train(model, train, valid, cfg, torch.device("cpu"), {"d_model": 64, "data": "a"}, max_steps=2)
    with pytest.raises(ValueError, match=r"other settings \(data differ\).*TRANSFORMER_WORK_DIR"):
        nb.train(model, train, valid, cfg, torch.device("cpu"), {"d_model": 64, "data": "b"}, max_steps=4)


def test_time_budget_stops_cleanly_with_a_checkpoint(nb, tmp_path, capsys):
    cfg, model, train, valid = small_setup(nb, tmp_path, "budget", time_budget_min=1e-9)
    state = nb.train(model, train, valid, cfg, torch.device("cpu"), {})
    assert state.step <= 1 and state.epoch == 0
    assert (Path(cfg.work_dir) / "checkpoints" / "last.pt").exists()
    assert "the time budget reached" in capsys.readouterr().out


def test_epoch_checkpoints_keep_the_last_k_and_average(nb, tmp_path):
    cfg, model, train, valid = small_setup(nb, tmp_path, "avg", epochs=4, average_last=2)
    nb.train(model, train, valid, cfg, torch.device("cpu"), {})
    paths = nb.epoch_checkpoints(Path(cfg.work_dir) / "checkpoints")
    assert [p.name for p in paths] == ["epoch3.pt", "epoch4.pt"]
    a, b = (torch.load(p, weights_only=True) for p in paths)
    averaged = nb.average_checkpoints(paths)
    assert torch.equal(b["embedding.weight"], model.state_dict()["embedding.weight"])
    for key in a:
        assert torch.allclose(averaged[key], (a[key].float() + b[key].float()) / 2)
    assert not torch.equal(averaged["embedding.weight"], b["embedding.weight"])


def test_checkpoint_write_is_atomic(nb, tmp_path, monkeypatch):
    """A crash while writing leaves the previous checkpoint intact."""
    path = tmp_path / "last.pt"
    nb.save_atomically({"step": 1}, path)

    def crash(obj, f):
        Path(f).write_bytes(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(nb.torch, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        nb.save_atomically({"step": 2}, path)
    monkeypatch.undo()
    assert torch.load(path) == {"step": 1}


def test_non_finite_loss_skips_the_step(nb, tmp_path):
    """A NaN loss leaves weights and Adam's state untouched; the next finite step updates them."""
    cfg, model, train, _ = small_setup(nb, tmp_path, "nan")
    optimizer = nb.make_optimizer(model, cfg)
    amp_dtype, scaler = nb.amp_settings(torch.device("cpu"), False)
    before = {k: v.clone() for k, v in model.state_dict().items()}

    def poisoned(src, tgt_in):
        return model(src, tgt_in) * float("nan")

    assert not torch.isfinite(nb.train_step(model, poisoned, train[0], optimizer, scaler, amp_dtype, cfg, 1))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(float(s["step"]) == 0 for s in optimizer.state.values())
    assert torch.isfinite(nb.train_step(model, model, train[0], optimizer, scaler, amp_dtype, cfg, 1))
    assert not all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_training_reports_skipped_steps(nb, tmp_path, capsys):
    cfg, model, train, valid = small_setup(nb, tmp_path, "nan-run")
    calls = []

    def poison_third_training_call(module, inputs, output):
        calls.append(module.training)
        return output * float("nan") if module.training and calls.count(True) == 3 else output

    model.register_forward_hook(poison_third_training_call)
    state = nb.train(model, train, valid, cfg, torch.device("cpu"), {}, max_steps=6)
    assert state.skipped_steps == 1
    assert "1 step(s) with a non-finite loss skipped" in capsys.readouterr().out
    assert nb.weights_are_finite(model) and all(map(math.isfinite, state.history["train_loss"]))


def test_non_finite_weights_are_never_checkpointed(nb, tmp_path):
    cfg, model, _, _ = small_setup(nb, tmp_path, "nanw")
    optimizer = nb.make_optimizer(model, cfg)
    _, scaler = nb.amp_settings(torch.device("cpu"), False)
    with torch.no_grad():
        model.embedding.weight[5, 0] = float("inf")
    path = tmp_path / "ck.pt"
    with pytest.warns(UserWarning, match="non-finite weights"):
        assert not nb.save_checkpoint(path, model, optimizer, scaler, nb.TrainState(), {})
    assert not path.exists()


def test_decoding_chunks_are_bounded_and_order_is_kept(nb, monkeypatch):
    """decode_corpus never hands the decoder more than decode_max_tokens (sentences x beams x length)."""
    cfg = nb.make_config("smoke", decode_max_tokens=600, max_extra_len=10)
    texts = nb.corpus["test"][0][:40]
    seen = []
    real = nb.beam_search

    def spy(model, src, beam, *args, **kwargs):
        seen.append(src.size(0) * beam * (src.size(1) + cfg.max_extra_len))
        return real(model, src, beam, *args, **kwargs)

    monkeypatch.setattr(nb, "beam_search", spy)
    chunked = nb.decode_corpus(nb.model, texts, cfg, torch.device("cpu"), beam=2)
    assert len(seen) > 1 and max(seen) <= cfg.decode_max_tokens
    one_by_one = [nb.decode_corpus(nb.model, [t], cfg, torch.device("cpu"), beam=2)[0] for t in texts[:8]]
    assert chunked[:8] == one_by_one


# ---------------------------------------------------------------- which BLEU, and the Multi30k download
def test_text_style_names_the_kind_of_bleu(nb):
    iwslt_like = ["it 's a great idea , and we 'll see .", "i do n't know what &apos;s going on ."] * 50
    assert nb.text_style(iwslt_like) == "lowercased, tokenized"
    assert nb.text_style(nb.corpus["test"][1]) == "cased, detokenized"
    assert nb.text_style([line.lower() for line in nb.corpus["test"][1]]) == "lowercased, detokenized"


def test_multi30k_download_writes_the_six_files_once(nb, tmp_path, monkeypatch):
    import gzip
    import io

    fetched = []

    def fake_urlopen(url, timeout):
        fetched.append(url)
        lang = url.split(".")[-2]
        return io.BytesIO(gzip.compress(f"{lang} one\n{lang} two\n".encode()))

    monkeypatch.setattr(nb.urllib.request, "urlopen", fake_urlopen)
    folder = nb.download_multi30k(tmp_path / "m30k")
    assert len(fetched) == 6 and any("test_2016_flickr.de.gz" in url for url in fetched)
    assert nb.read_parallel_folder(folder)["validation"] == (["de one", "de two"], ["en one", "en two"])
    nb.download_multi30k(tmp_path / "m30k")
    assert len(fetched) == 6  # already there: nothing fetched again


def test_multi30k_download_failure_explains_offline_use(nb, tmp_path, monkeypatch):
    def offline(url, timeout):
        raise OSError("Temporary failure in name resolution")

    monkeypatch.setattr(nb.urllib.request, "urlopen", offline)
    with pytest.raises(ConnectionError, match="could not download .*TRANSFORMER_DATA_DIR"):
        nb.download_multi30k(tmp_path / "m30k")
