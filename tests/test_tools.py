"""The tools under tests/tools, on a CPU: gpu_check.py's command without a GPU (it must say so, exit 0 and write
nothing), its pure helpers and its measuring functions at tiny sizes; the GPU command's dry run; the shared helpers of
tools/common.py; benchmark.py, profile_step.py and try_preset.py run end to end at their smallest sizes. Speed is
reported by the tools, never asserted here."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
import torch
from helpers import CPU, ROOT, SLICE, tiny_setup
from tools import common, gpu_check, gpu_run


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
        gpu_check.parse_args(["--skip", "memory,trainig"])
    assert "unknown phase(s) trainig" in capsys.readouterr().err
    assert gpu_check.parse_args(["--skip", "memory,benchmark"]).skip == "memory,benchmark"


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


def test_t4_projection_is_the_arithmetic_it_states():
    """A step of 10 ms on the GPU, 40 % of it matrix products, on a GPU 10x the T4's tensor peak and 5x its bandwidth:
    on a T4 the products take 4 x 10 = 40 ms (their 1.3 GFLOP at 65 TFLOP/s would take 0.02 ms), the rest 6 x 5 = 30 ms;
    a host of 50 ms (or 100 ms, twice as slow) against 70 ms of GPU: GPU-bound, then host-bound. 2,000 target tokens
    a step; the epoch: 100,000 tokens x 10 (the pairs' ratio) over the tokens a second; 30 minutes' worth of them."""
    row = {"max_tokens": 4096, "gpu_s": 0.010, "matmul_share": 0.4, "gflop_per_step": 1.3, "host_s": 0.050,
           "step_s": 0.012, "target_tokens_per_step": 2000.0, "epoch_target_tokens": 100_000}
    device = {"tflops": 650.0, "gb_s": 1600.0}
    [p] = gpu_check.t4_projection([row], device, pairs_ratio=10.0, budget_min=30.0)
    assert (p["t4_matmul_ms"], p["t4_rest_ms"], p["t4_gpu_ms"]) == (40.0, 30.0, 70.0)
    assert p["host_ms"] == [50.0, 100.0] and p["t4_step_ms"] == [70.0, 100.0] and p["bound_by"] == ["gpu", "host"]
    assert p["t4_target_tokens_per_s"] == [round(2000 / 0.07), 20_000]
    assert p["epoch_s"] == [round(1e6 / (2000 / 0.07), 1), 50.0] and p["epochs_in_budget"][1] == 36.0
    slow = {**row, "gflop_per_step": 3250.0}  # products that could not run faster than 50 ms at the T4's peak
    assert gpu_check.t4_projection([slow], device, 10.0, 30.0)[0]["t4_matmul_ms"] == 50.0
    cpu = {**row, "gpu_s": None}  # a dry run on a CPU: the step's wall time stands in for the GPU's
    assert gpu_check.t4_projection([cpu], device, 10.0, 30.0)[0]["t4_gpu_ms"] == 84.0
    assert gpu_check.published_figures("NVIDIA H100 80GB HBM3") == {"name": "NVIDIA H100 80GB HBM3", "tflops": 989.4,
                                                                     "gb_s": 3350.0}
    assert gpu_check.published_figures("NVIDIA H100 PCIe")["gb_s"] == 2000.0
    assert gpu_check.published_figures("Tesla T4")["tflops"] == gpu_check.T4["tflops"]
    assert gpu_check.published_figures("NVIDIA GeForce RTX 3090") is None


def test_a_gpu_time_that_waited_on_the_host_is_not_projected():
    """Most of a row's split steps waited for the GPU (its sleep did not cover the host's issuing): their CUDA events
    hold the host's time too, so the projection takes the profiler's kernel time per step instead, and says so."""
    row = {"max_tokens": 4096, "gpu_s": 0.050, "host_waited": 6, "split_steps": 10, "profiled_ms_per_step": 10.0,
           "matmul_share": 0.4, "gflop_per_step": 1.3, "host_s": 0.050, "step_s": 0.052,
           "target_tokens_per_step": 2000.0, "epoch_target_tokens": 100_000}
    device = {"tflops": 650.0, "gb_s": 1600.0}
    [p] = gpu_check.t4_projection([row], device, pairs_ratio=10.0, budget_min=30.0)
    assert p["t4_gpu_ms"] == 70.0 and p["gpu_s_from"].startswith("profiled_ms_per_step")  # 10 ms, as in the test above
    [p] = gpu_check.t4_projection([{**row, "host_waited": 5}], device, 10.0, 30.0)  # half of them: the events hold
    assert p["t4_gpu_ms"] == 350.0 and p["gpu_s_from"] == "gpu_s"


def test_a_profile_without_kernel_time_is_refused_on_a_gpu():
    """On a GPU (the kernels' own time given, not None) operators that got no device time mean the profiler lost the
    kernels: an error, not a matrix-product share of 0; on a GPU's fused dropout the group is dropout's."""
    with pytest.raises(RuntimeError, match="no kernel time"):
        gpu_check.attributed_time({"matrix products": 0.0, "the rest": 0.0}, kernels=1234.0)
    assert gpu_check.attributed_time({"matrix products": 3.0, "the rest": 1.0}, kernels=4.2) == 4.0
    assert gpu_check.attributed_time({}, kernels=None) == 1.0  # a CPU's: nothing to refuse
    from tools import profile_step
    for name in ("aten::native_dropout", "aten::native_dropout_backward", "aten::uniform_"):
        assert profile_step.group_of(name, [[8, 256]], 1000) == "dropout", name


def test_the_gpu_command_keeps_what_a_killed_part_wrote(tmp_path):
    """A notebook part killed at its limit: the run's results.json and history.json that it had written reach OUT
    all the same, and a temporary file left in OUT by a kill is removed (the device tool brings back at most 8
    files). gpu_check, given a deadline (a Unix time, counted from before it started) already past, records that
    each of its phases did not run. The budget is three times what this machine took for the same notebook without
    its sleep, so that a slow machine's kernel still writes the files before the kill."""
    def notebook(name: str, sleep_s: int) -> str:
        nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
            "import os, pathlib, time\nrun = pathlib.Path(os.environ['TRANSFORMER_WORK_DIR']) / 'cpu-x' / 'run-y'\n"
            "run.mkdir(parents=True)\n(run / 'results.json').write_text('{\"bleu\": {}}')\n"
            f"(run / 'history.json').write_text('{{}}')\ntime.sleep({sleep_s})")]), tmp_path / name)
        return str(tmp_path / name)

    (tmp_path / "quick").mkdir()
    assert gpu_run.main([str(tmp_path / "quick"), "--dry-run", "--notebook", notebook("quick.ipynb", 0),
                         "--skip", "notebook_fp16,gpu_check"]) == 0
    took = json.loads((tmp_path / "quick" / "gpu_run.json").read_text())["parts"]
    assert (tmp_path / "quick" / "results.json").exists()  # a part that ends: its files copied too
    budget = gpu_run.RESERVE_S + 3 * (took["setup"]["wall_s"] + took["notebook"]["wall_s"]) + 10
    out = tmp_path / "out"
    out.mkdir()
    (out / "transformer-smoke.ipynb.tmp").write_text("half a notebook")
    start = time.monotonic()
    code = gpu_run.main([str(out), "--dry-run", "--budget-s", str(budget), "--notebook", notebook("slow.ipynb", 600),
                         "--skip", "notebook_fp16"])
    summary = json.loads((out / "gpu_run.json").read_text())
    assert code == 1 and summary["parts"]["notebook"]["status"].startswith("timed out"), summary["parts"]
    assert time.monotonic() - start < budget + 30  # killed at its limit, not after the cell's 600 s
    assert json.loads((out / "results.json").read_text()) == {"bleu": {}} and (out / "history.json").exists()
    assert not list(out.glob("*.tmp"))
    assert gpu_check.main(["--dry-run", "--out", str(out), "--deadline-at", str(time.time() - 1)]) == 0
    checks = json.loads((out / "cpu_dry_run.json").read_text())
    assert all(checks[phase]["error"].startswith("PhaseTimeout: not run") for phase in gpu_check.PHASES), checks


def test_batch_sizes_measured_survive_a_kill_from_outside(tmp_path, monkeypatch):
    """gpu_run kills gpu_check at its own deadline, which may fall inside phase 1: each size's row is in the file
    as soon as it is measured, marked partial (a kill is stood in for by KeyboardInterrupt, which no phase catches)."""
    sizes = []

    def measured(m, cfg, device, size, *rest):
        if sizes:
            raise KeyboardInterrupt
        sizes.append(size)
        return {"max_tokens": size, "step_s": 0.5, "target_tokens_per_s": 100.0}

    monkeypatch.setattr(gpu_check, "batch_size_row", measured)
    with pytest.raises(KeyboardInterrupt):
        gpu_check.main(["--dry-run", "--out", str(tmp_path), "--skip", "benchmark,memory"])
    written = json.loads((tmp_path / "cpu_dry_run.json").read_text())["batch_sizes"]
    assert written["partial"] and [r["max_tokens"] for r in written["rows"]] == sizes == [gpu_check.DRY_BATCH_SIZES[0]]


def test_the_fp16_part_killed_leaves_its_checkpoints_figures(tmp_path):
    """The fp16 part cut short has no report cell's figures: its last checkpoint's steps, skipped steps and scale."""
    folder = tmp_path / "fp16" / "smoke-x" / "run-y" / "checkpoints"
    folder.mkdir(parents=True)
    state = {"step": 120, "epoch": 3, "seconds": 90.0, "skipped_steps": 4, "history": {"step": [50, 100]}}
    torch.save({"state": state, "scaler": {"scale": 8192.0}}, folder / "last.pt")
    gpu_run.fp16_from_checkpoint(tmp_path / "fp16", tmp_path / "smoke-fp16.json")
    got = json.loads((tmp_path / "smoke-fp16.json").read_text())
    assert (got["steps"], got["epochs"], got["train_min"], got["skipped_steps"], got["scaler_scale"]) == (
        120, 3, 1.5, 4, 8192.0)
    assert "did not finish" in got["error"] and got["history"] == {"step": [50, 100]}
    (tmp_path / "smoke-fp16.json").write_text('{"bleu": 1}')  # the report's own figures are never replaced
    gpu_run.fp16_from_checkpoint(tmp_path / "fp16", tmp_path / "smoke-fp16.json")
    assert json.loads((tmp_path / "smoke-fp16.json").read_text()) == {"bleu": 1}
    assert gpu_run.nvidia_smi() if torch.cuda.is_available() else gpu_run.nvidia_smi().startswith("not read")


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


def test_the_gpu_command_runs_dry_on_a_cpu(gpu_dry_run):
    """`python3 tests/tools/gpu_run.py OUT --dry-run` (conftest.py), the one device call of a GPU run at smoke sizes:
    every part and every gpu_check phase ends without an error, and OUT holds the eight files the device tool brings
    back (at most 8). The fp16 part ran the notebook down to its evaluation with the forcing cell and reported its
    run; the batch-size phase measured each size; the projection made a row of each; the benchmark drives the
    notebook's own train_step, greedy_decode and beam_search (and nn.Transformer through them), so an API change it
    does not follow fails here, not on the GPU. What the parts measure is reported, never asserted, except what must
    hold on any device: the two models agree on the same weights and the notebook decodes the same with and without
    its cache."""
    out, done = gpu_dry_run
    summary = json.loads((out / "gpu_run.json").read_text())
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert {name: part["status"] for name, part in summary["parts"].items()} == dict.fromkeys(
        ("setup", "notebook", "notebook_fp16", "gpu_check"), "ok")
    assert sorted(p.name for p in out.iterdir()) == sorted([
        "gpu_run.json", "gpu_run.log", "cpu_dry_run.json", "transformer-smoke.ipynb", "results.json", "history.json",
        "transformer-smoke-fp16.ipynb", "smoke-fp16.json"])
    fp16 = json.loads((out / "smoke-fp16.json").read_text())
    assert fp16["autocast"] == "None"  # on a CPU the forced cell changes nothing: fp32
    assert fp16["steps"] > 0 and fp16["skipped_steps"] == 0 and fp16["scaler_scale"] > 0
    assert fp16["bleu"] and fp16["bleu"] == fp16["results"]["bleu"]
    executed = nbformat.read(out / "transformer-smoke-fp16.ipynb", as_version=4)
    assert "[gpu_run] fp16 autocast" in "".join(c.source for c in executed.cells)
    assert set(summary["fp16_vs_bf16"]) == set(fp16["bleu"]) | set(json.loads((out / "results.json").read_text())["bleu"])
    checks = json.loads((out / "cpu_dry_run.json").read_text())
    assert checks["dry_run"]
    assert {phase: checks[phase].get("error") for phase in gpu_check.PHASES} == dict.fromkeys(gpu_check.PHASES)
    rows = checks["batch_sizes"]["rows"]
    assert [r["max_tokens"] for r in rows] == list(gpu_check.DRY_BATCH_SIZES)
    assert all(is_duration(r["step_s"]) and is_duration(r["host_s"]) and r["gpu_s"] is None for r in rows)
    assert all(0 <= r["matmul_share"] <= 1 and r["gflop_per_step"] > 0 for r in rows)
    assert [p["max_tokens"] for p in checks["projection"]["rows"]] == list(gpu_check.DRY_BATCH_SIZES)
    result = checks["benchmark"]
    assert result["max_abs_logit_diff_same_weights"] < 1e-4
    assert result["train"]["notebook"]["skipped_steps"] == result["train"]["torch"]["skipped_steps"] == 0
    assert all(math.isfinite(result["train"][model]["loss_per_token"]) for model in ("notebook", "torch"))
    assert all(run["notebook"]["same_outputs_as_cache"] == 1.0 for run in (result["decode"]["greedy_no_cache"],
                                                                          result["decode"]["beam4_no_cache"]))
    assert checks["evaluation"]["test_sentences"] == gpu_check.DRY_SENTENCES
    assert checks["evaluation"]["estimated_evaluation_s"] is not None  # phase 4's projection reached it


def test_cells_are_found_by_what_they_call_and_the_config_line_is_patched_once():
    """tools/common.py on a made-up notebook: the `# [slow]` cells that call train() and evaluate() (not
    `model.train()`, not a fast cell, not a comment), the evaluation cell being the first after training; the cfg
    line patched, its comment kept; none, or two, of it is an error naming what is missing."""
    code = nbformat.v4.new_code_cell
    nb = nbformat.v4.new_notebook(cells=[
        code("def train(model):\n    model.train()\n    return evaluate(model)"),  # defines and calls, not slow
        code("cfg = make_config()  # the line to edit\nprint(cfg)"),
        code("# [slow] a demo\nmodel.train()  # train(model) in a comment"),
        code("# [slow] trains the model\nstate = train(model)"),
        code("# [slow] scores\nevaluation = evaluate(model)"),
        code("# [slow] the sweep\nif better:\n    evaluation = evaluate(model, beam)")])
    assert (common.training_cell(nb), common.evaluation_cell(nb)) == (3, 4)
    assert common.cells_calling(nb, "evaluate") == [4, 5] and common.cells_calling(nb, "train", slow=None) == [3]
    assert common.cells_calling(nb, "evaluate", slow=None) == [0, 4, 5]
    assert common.cells_assigning(nb, "evaluation") == [4, 5]
    with pytest.raises(LookupError, match=r"calls beam_sweep\(\)"):
        common.cells_calling(nb, "beam_sweep")
    common.with_settings(nb, {"epochs": 1})
    assert nb.cells[1].source == "cfg = make_config(**{'epochs': 1})  # the line to edit\nprint(cfg)"
    with pytest.raises(ValueError, match="occurs 0 times"):
        common.with_settings(nb, {"epochs": 2})


def test_a_tool_loading_the_notebook_leaves_the_suites_notebook_module_alone(nb, tmp_path):
    """gpu_check loads the notebook again in the suite's process; that copy must not take the suite's module name in
    sys.modules, where model_code looks up the names the model's code uses: the same model would hash otherwise
    (its classes' code walked twice, once as each copy's), and the re-run test of test_end_to_end.py then failed
    whenever it ran after this file."""
    model = nb.build_model(nb.cfg, nb.VOCAB)
    before = nb.model_code(model)
    other = common.load_notebook_module("smoke", SLICE, tmp_path)
    again = gpu_check.load_notebook_module("smoke", SLICE, tmp_path / "again")  # the tools' own import of common.py
    try:
        assert sys.modules[nb.__name__] is nb and nb.model_code(model) == before
        assert other.model_code(other.build_model(other.cfg, other.VOCAB)) == before  # the same code: the same hash
        assert sys.modules[again.__name__] is again and sys.modules[other.__name__] is other  # neither replaced
    finally:
        for module in (other, again):
            sys.modules.pop(module.__name__, None)


def test_files_are_written_whole(tmp_path):
    """common.write_json: the file appears whole, with nothing left beside it."""
    common.write_json(tmp_path / "a" / "b.json", {"ü": [1, 2]})
    assert json.loads((tmp_path / "a" / "b.json").read_text(encoding="utf-8")) == {"ü": [1, 2]}
    assert [p.name for p in (tmp_path / "a").iterdir()] == ["b.json"]


def readable(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:  # a process that ended meanwhile, or another user's
        return b""


def test_a_part_past_its_limit_is_killed_with_what_it_started_and_the_next_runs(tmp_path):
    """gpu_run.run_part: a part that outlives its limit is killed, with a process it started in a session of its own
    (as a Jupyter kernel is), and recorded; gpu_check's time_limit stops a phase running in-process, as PhaseTimeout
    even where the code it stops turns every Exception into another error (as the notebook's cells do)."""
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

    def wrapped() -> None:  # as the notebook's cells wrap errors: a disk's, a checkpoint's
        try:
            time.sleep(5)
        except Exception as error:
            raise RuntimeError("the checkpoint could not be written") from error

    with pytest.raises(gpu_check.PhaseTimeout), gpu_check.time_limit(0.2):  # not renamed by the code it stops
        wrapped()


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
