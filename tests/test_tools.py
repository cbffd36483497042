"""The tools under tests/tools, on a CPU: gpu_check.py's command without a GPU (it must say so, exit 0 and write
nothing), its pure helpers and its measuring functions at tiny sizes; benchmark.py run end to end at its smallest
sizes. Speed is reported by the tools, never asserted here."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import CPU, ROOT, tiny_setup
from tools import gpu_check, gpu_run


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the command measures for minutes")
def test_without_a_gpu_it_says_so_exits_0_and_writes_nothing():
    """`python tests/tools/gpu_check.py`, as results/gpu/README.md names it (cheap: it only starts python and imports torch)."""
    before = sorted(p for p in (ROOT / "results").rglob("*"))
    done = subprocess.run([sys.executable, "tests/tools/gpu_check.py"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == gpu_check.NO_GPU
    assert sorted(p for p in (ROOT / "results").rglob("*")) == before


def test_results_file_is_named_after_the_device(tmp_path):
    assert gpu_check.results_path(tmp_path, "Tesla T4") == tmp_path / "Tesla_T4.json"
    assert gpu_check.results_path("r", "NVIDIA A100-SXM4-40GB").name == "NVIDIA_A100-SXM4-40GB.json"
    assert gpu_check.results_path("r", "NVIDIA H100 80GB HBM3").name == "NVIDIA_H100_80GB_HBM3.json"
    assert gpu_check.results_path("r", "../..").name == "gpu.json"  # never outside the folder


def test_unknown_phase_to_skip_is_an_error(capsys):
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--skip", "notebook,trainig"])
    assert "unknown phase(s) trainig" in capsys.readouterr().err
    assert gpu_check.parse_args(["--skip", "notebook,benchmark"]).skip == "notebook,benchmark"


def test_hub_text_is_found_and_becomes_a_training_folder(tmp_path):
    """The first candidate holding validation and test in both languages is used; the training folder made from it
    trains and validates on the validation text and tests on the test set."""
    empty, hub = tmp_path / "empty", tmp_path / "hub"
    empty.mkdir()
    hub.mkdir()
    for split, lines in (("validation", ["a b", "c d", "e f"]), ("test", ["x y"])):
        for lang in ("de", "en"):
            (hub / f"{split}.{lang}").write_text("".join(f"{lang} {line}\n" for line in lines), encoding="utf-8")
    files = tuple(f"{s}.{lang}" for s in ("validation", "test") for lang in ("de", "en"))
    assert gpu_check.find_folder([tmp_path / "missing", empty, hub], files) == hub
    assert gpu_check.find_folder([empty], files) is None
    assert gpu_check.data_candidates("iwslt14/hub", str(hub))[0] == hub
    folder = gpu_check.iwslt14_training_folder(hub, tmp_path / "data")
    for lang in ("de", "en"):
        assert (folder / f"train.{lang}").read_text() == (hub / f"validation.{lang}").read_text()
        assert (folder / f"validation.{lang}").read_text() == (hub / f"validation.{lang}").read_text()
        assert (folder / f"test.{lang}").read_text() == (hub / f"test.{lang}").read_text()
    assert gpu_check.line_count(folder / "train.de") == 3


def test_what_the_smoke_notebook_and_the_benchmark_print_is_read():
    text = ("664 steps in 0.6 min; training loss per token 7.123 -> 4.321; 0 steps skipped\n"
            "                       last weights,  greedy: BLEU =  6.51 on 200 test sentences (cased, detokenized)\n"
            " final-stretch average of 3 weights,  beam 4: BLEU =  3.61 (13a:  3.70) on 200 test sentences\n")
    summary = gpu_check.notebook_summary(text)
    assert (summary["train_steps"], summary["train_min"], summary["skipped_steps"]) == (664, 0.6, 0)
    assert summary["bleu"] == [{"weights": "last", "decoding": "greedy", "bleu": 6.51},
                               {"weights": "final-stretch average of 3", "decoding": "beam 4", "bleu": 3.61}]
    assert gpu_check.notebook_summary("")["bleu"] == []
    assert gpu_check.benchmark_json('table\nBENCHMARK_JSON {"a": 1}\n') == {"a": 1}
    with pytest.raises(RuntimeError, match="no BENCHMARK_JSON"):
        gpu_check.benchmark_json("Traceback ...")


def test_projection_and_evaluation_estimate_add_up():
    """The steady epoch's training time scales with the pairs, its validation does not; section 11's estimate is
    2 x (validation greedy + test greedy + test beam) + one validation greedy per weight file + the sweep + the second
    scoring with the sweep's choice, 2 x (validation greedy + test beam)."""
    epochs = [{"steps": 60, "seconds": 50.0}, {"steps": 60, "seconds": 30.0}]
    p = gpu_check.training_projection(epochs, validation_s=10.0, pairs=1000, budget_min=30.0, real_pairs=10_000)
    assert p == {"pairs_ratio": 10.0, "steps_per_epoch": 600, "epoch_s": 210.0, "epochs_in_budget": round(1800 / 210, 2)}
    timing = {"valid_greedy_s": 2.0, "test_greedy_s": 10.0, "test_beam_s": 30.0, "sweep_s": 5.0}
    assert gpu_check.estimate_evaluation_s(timing, weight_files=13) == 2 * 42.0 + 13 * 2.0 + 5.0 + 2 * 32.0


def is_duration(seconds) -> bool:
    """A measured duration: a finite, unrounded float that is not negative. Never its size: a fast machine decodes
    three sentences in under a millisecond."""
    return isinstance(seconds, float) and math.isfinite(seconds) and seconds >= 0


def test_training_and_evaluation_are_measured_on_a_cpu(nb, tmp_path):
    """train_epochs and evaluation_timing, the functions phases 4 and 5 run on a GPU, at tiny sizes on a CPU: the
    notebook's train() epoch by epoch (resuming in between), and every decoding of section 11 once (about 2 s)."""
    cfg, model, batch = tiny_setup(nb, tmp_path, max_extra_len=4, beam_size=2)
    trained = gpu_check.train_epochs(nb, model, cfg, [batch], [batch], CPU, {"data": "tiny"}, epochs=2)
    assert [(e["epoch"], e["steps"]) for e in trained["epochs"]] == [(1, 1), (2, 1)]
    assert all(is_duration(e["seconds"]) and e["peak_allocated_mib"] is None for e in trained["epochs"])
    assert trained["skipped_steps"] == 0 and is_duration(trained["validation_s"])
    assert trained["target_tokens_per_epoch"] == batch.n_tokens
    test = (nb.corpus["test"][0][:3], nb.corpus["test"][1][:3])
    timing = gpu_check.evaluation_timing(nb, model, nb.tokenizer, cfg, CPU, test, nb.corpus["validation"][0][:3],
                                         torch.bfloat16)
    assert (timing["test_sentences"], timing["valid_sentences"], timing["beam"]) == (3, 3, 2)
    assert all(is_duration(timing[k]) for k in ("test_greedy_s", "test_beam_s", "valid_greedy_s", "sweep_s",
                                                "test_greedy_autocast_s"))
    assert timing["autocast"] == "bfloat16" and 0 <= timing["autocast_same_outputs"] <= 1
    assert gpu_check.estimate_evaluation_s(timing, weight_files=5) >= 0


def test_the_gpu_command_runs_dry_on_a_cpu(gpu_dry_run):
    """`python3 tests/tools/gpu_run.py OUT --dry-run` (conftest.py), the one device call of the first GPU run at smoke
    sizes: every part and every gpu_check phase ends without an error, and OUT holds the six files the device tool
    brings back (at most 8). The benchmark phase drives the notebook's own train_step, greedy_decode and beam_search
    (and nn.Transformer through them), so an API change it does not follow fails here, not on the GPU. What the parts
    measure is reported, never asserted, except what must hold on any device: the two models agree on the same
    weights and the notebook decodes the same with and without its cache."""
    out, done = gpu_dry_run
    summary = json.loads((out / "gpu_run.json").read_text())
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert {name: part["status"] for name, part in summary["parts"].items()} == dict.fromkeys(
        ("setup", "notebook", "gpu_check"), "ok")
    assert sorted(p.name for p in out.iterdir()) == sorted(["gpu_run.json", "gpu_run.log", "cpu_dry_run.json",
                                                            "transformer-smoke.ipynb", "results.json", "history.json"])
    checks = json.loads((out / "cpu_dry_run.json").read_text())
    assert checks["dry_run"] and "notebook" not in checks  # the notebook part ran the notebook already
    assert {phase: checks[phase].get("error") for phase in gpu_check.PHASES[:-1]} == dict.fromkeys(
        gpu_check.PHASES[:-1])
    result = checks["benchmark"]
    assert result["max_abs_logit_diff_same_weights"] < 1e-4
    assert result["train"]["notebook"]["skipped_steps"] == result["train"]["torch"]["skipped_steps"] == 0
    assert all(math.isfinite(result["train"][model]["loss_per_token"]) for model in ("notebook", "torch"))
    assert all(run["notebook"]["same_outputs_as_cache"] == 1.0 for run in (result["decode"]["greedy_no_cache"],
                                                                          result["decode"]["beam4_no_cache"]))
    assert checks["evaluation"]["test_sentences"] == gpu_check.DRY_SENTENCES
    assert checks["fp16"]["steps"] == 3 and checks["fp16"]["finite_weights"]


def readable(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:  # a process that ended meanwhile, or another user's
        return b""


def test_a_part_past_its_limit_is_killed_with_what_it_started_and_the_next_runs(tmp_path):
    """gpu_run.run_part: a part that outlives its limit is killed, with a process it started in a session of its own
    (as a Jupyter kernel is), and recorded; gpu_check's time_limit stops a phase running in-process."""
    env = {**os.environ, "GPU_RUN_PART": f"test-{os.getpid()}-{time.time()}"}
    script = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
              "start_new_session=True); time.sleep(60)")
    part = gpu_run.run_part(tmp_path, [sys.executable, "-c", script], 3, env)
    assert part["status"] == "timed out after 3 s" and part["wall_s"] < 30
    mark = f"GPU_RUN_PART={env['GPU_RUN_PART']}".encode()
    for _ in range(50):  # SIGKILL takes effect soon, not at once
        if not [e for e in Path("/proc").glob("[0-9]*/environ") if mark in readable(e).split(b"\0")]:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("a process of the killed part is still running")
    assert gpu_run.run_part(tmp_path, [sys.executable, "-c", "print('next')"], 30, env)["status"] == "ok"
    assert "next" in (tmp_path / "gpu_run.log").read_text()
    with pytest.raises(gpu_check.PhaseTimeout), gpu_check.time_limit(0.2):
        time.sleep(5)


def test_the_profile_command_runs_and_its_groups_add_up():
    """`python tests/tools/profile_step.py` at the smallest sizes (2 steps of the smoke preset): it drives the
    notebook's own train_step under the profiler; its groups share out the step time (they add up to it, each at
    least 0), and the matrix products it replays give a positive sgemm limit and a share of it."""
    done = subprocess.run([sys.executable, "tests/tools/profile_step.py", "--steps", "2", "--warmup", "1", "--top", "2"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("PROFILE_JSON "))
    result = json.loads(line.removeprefix("PROFILE_JSON "))
    groups = result["groups_ms"]
    assert min(groups.values()) >= 0 and sum(groups.values()) == pytest.approx(result["step_ms"], abs=0.1 * len(groups))
    for group in ("matrix products", "over the vocabulary (loss, its gradient)", "attention (SDPA)", "Adam"):
        assert groups[group] > 0, group  # each found its operators
    assert result["gflop_per_step"] > 0 and result["sgemm_limit_gflops"] > 0
    assert 0 < result["sgemm_share"] < 1.5  # the step's products cannot run much faster than the same products alone
    assert "| matrix products |" in done.stdout


def test_try_preset_trains_on_validation_only_and_times_variants(tmp_path):
    """`python tests/tools/try_preset.py` at smoke sizes: `train` runs all its epochs despite a budget too short for
    them (a budget of 0.6 ms would stop it after one step), keeps the snapshots asked for, scores their averages and
    section 11's alphas on validation sentences, and never runs section 11's evaluation (no results.json); `speed`
    reports each variant's epoch, the first at ratio 1."""
    settings = json.dumps({"epochs": 2, "time_budget_min": 1e-5, "max_train_pairs": 600, "max_eval_sentences": 40})
    done = subprocess.run([sys.executable, "tests/tools/try_preset.py", "train", "tiny", settings, "--snapshots", "3",
                           "--work-dir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(next(x for x in done.stdout.splitlines() if x.startswith("TRY_JSON ")).removeprefix("TRY_JSON "))
    assert result["epochs"] == 2 and len(result["val_nll"]) == 2  # the settings' budget was lifted
    assert list(result["valid_greedy"]) == ["last", "last 2 of 3", "last 3 of 3"]
    assert result["validation_sentences"] == 40 and sorted(result["valid_beam4"]) == ["0.0", "0.6", "1.0", "1.4"]
    assert json.loads((tmp_path / "tiny" / "result.json").read_text()) == result
    assert not list(tmp_path.rglob("results.json"))  # section 11's evaluation (the test set) never ran
    variants = json.dumps({"a": {}, "b": {"max_tokens": 512}})
    done = subprocess.run([sys.executable, "tests/tools/try_preset.py", "speed", variants, "--rounds", "2", "--tokens",
                           "300"], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    speeds = json.loads(next(x for x in done.stdout.splitlines() if x.startswith("TRY_JSON ")).removeprefix("TRY_JSON "))
    assert speeds["a"]["speed_ratio"] == 1.0 and speeds["b"]["steps_per_epoch"] > speeds["a"]["steps_per_epoch"] > 0
