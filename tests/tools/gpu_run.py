"""A GPU session's measuring, in one command and one device call of at most 9 minutes: the whole notebook on the
multi30k preset, the same preset with fp16 autocast and the gradient scaler forced for the whole run (a T4's path),
then gpu_check.py's phases, each part within its own time limit and all within --budget-s. First run on an H100 on
2026-11-26: results/gpu/README.md.

    python3 tests/tools/gpu_run.py OUT              # on the GPU machine, from the repository root (see below)
    python3 tests/tools/gpu_run.py OUT --dry-run    # on a CPU: the same parts at smoke sizes (tests/test_tools.py)

Before a device call, on this machine (it reaches the package index; the device does not):

    tests/tools/gpu_prepare.sh                      # .gpu/: the wheels the device lacks, Multi30k, IWSLT14's Hub text

then the device tool's run with carry [".gpu"] and the command
`GPU_RUN_COMMIT=<the commit> python3 tests/tools/gpu_run.py $OUT` (the device gets the files, not .git).

The parts, in order of what the run is for:
1. setup: the wheels in .gpu/wheels installed into /tmp/site (datasets, nbformat, nbclient, ipykernel: the device has
   torch, tokenizers, sacrebleu, matplotlib and tqdm), a Jupyter kernel, and what the machine is.
2. notebook: transformer.ipynb on the multi30k preset (a dry run: smoke) on the GPU's own path (bf16 on an H100),
   executed by nbclient in a kernel and saved after every cell into OUT/transformer-<preset>.ipynb, so that a run
   cut short keeps what it did; the run's results.json and history.json copied to OUT.
3. notebook_fp16: the same preset, the notebook down to section 11's evaluation cell (of its `# [slow]` cells only
   the training and evaluation cells), with one cell added after the one that defines autocast_dtype, making it
   answer fp16 on a GPU: the whole training under fp16 autocast with the gradient scaler, as on a T4 (validation
   and decoding run in fp32, as the notebook always decodes). OUT/transformer-<preset>-fp16.ipynb, and
   OUT/<preset>-fp16.json:
   the run's steps, skipped steps, the scaler's final scale (from the checkpoint last.pt), history and results,
   read by a cell added at the end. gpu_run.json puts its BLEU beside the bf16 run's (fp16_vs_bf16). A dry run
   trains it on DRY_FP16_SETTINGS (seconds; on a CPU the cell changes nothing: fp32, the scaler still runs).
4. gpu_check: `tests/tools/gpu_check.py` (its own phases, each with its own limit) into OUT/<device>.json.
A part that fails or runs out of time records its error in OUT/gpu_run.json and the next part runs (a notebook part
killed at its limit still has its run's files copied to OUT, if it wrote them); the whole log is OUT/gpu_run.log.
Eight files in all: the device tool brings back at most 8 (a temporary file left by a kill is removed at the end).

Expected on an H100 (estimated from the 2026-11-26 run, not measured): setup 20 s, notebook 140 s, notebook_fp16
110 s, gpu_check 250 s: about 8.7 minutes with the budget's cut of the last phases. A T4 is several times slower:
there the budget stops the run in its gpu_check phases, which then record "not run: no time".
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # tests/tools/gpu_run.py: the repository root
sys.path[:0] = [str(ROOT / "tests" / "tools"), str(ROOT / "tests")]  # common.py beside this file, nbloader in tests/
import common

PREPARED = ROOT / ".gpu"  # made by gpu_prepare.sh, ignored by git, carried to the device
SITE = Path("/tmp/site")  # where the carried wheels are installed on the device
MISSING_ON_DEVICE = ("datasets", "nbformat", "nbclient", "ipykernel")
NOTEBOOK_LIMIT_S = 240  # on a GPU: the multi30k preset took 136 s in all on an H100 (2026-11-26); room for slower GPUs
FP16_LIMIT_S = 200  # the same preset down to its evaluation: about 110 s on an H100 (estimated)
# (a dry run has only --budget-s, so that a slow CPU cannot fail it)
RESERVE_S = 15  # kept back at the end for writing the summary
DRY_FP16_SETTINGS = {"epochs": 1, "max_train_pairs": 600, "max_eval_sentences": 8}  # a dry run's fp16 part: seconds
FORCE_FP16 = """# [gpu_run] fp16 autocast with the gradient scaler for the whole run, as on a GPU without bf16 (a Colab T4)
def autocast_dtype(device: torch.device, enabled: bool = True) -> torch.dtype | None:
    return torch.float16 if enabled and device.type == "cuda" else None
"""
REPORT = """# [gpu_run] the run's figures for gpu_run.py: one line GPU_RUN_JSON {...}
import json as _json

_last = torch.load(trained_folder / "checkpoints" / "last.pt", map_location="cpu", weights_only=False)
print("GPU_RUN_JSON " + _json.dumps({
    "autocast": str(autocast_dtype(device, cfg.amp)), "steps": state.step, "epochs": state.epoch,
    "train_min": round(state.seconds / 60, 2), "skipped_steps": state.skipped_steps,
    "scaler_scale": (_last.get("scaler") or {}).get("scale"), "bleu": evaluation.get("bleu"),
    "history": state.history, "results": evaluation}, default=str))
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="folder for the files that come back ($OUT on the device)")
    p.add_argument("--dry-run", action="store_true", help="on a CPU: every part at smoke sizes")
    p.add_argument("--budget-s", type=float, default=530.0, help="seconds for all the parts (default 8 min 50 s)")
    p.add_argument("--skip", default="", help="parts to leave out, comma-separated: notebook, notebook_fp16, gpu_check")
    p.add_argument("--notebook", default=str(ROOT / "transformer.ipynb"), help="the notebook the notebook part runs "
                   "(the tests give a copy with every code cell doubled: one kernel run for several tests)")
    p.add_argument("--execute-notebook", nargs=3, metavar=("PRESET", "WORK", "DATA_DIR"),
                   help=argparse.SUPPRESS)  # a notebook part's own process ('' for no data folder)
    p.add_argument("--fp16", action="store_true", help=argparse.SUPPRESS)  # that process: notebook_fp16
    return p.parse_args(argv)


def log(out: Path, text: str) -> None:
    print(text, flush=True)
    with open(out / "gpu_run.log", "a", encoding="utf-8") as f:
        f.write(text + "\n")


def write_summary(out: Path, summary: dict) -> None:
    common.write_json(out / "gpu_run.json", summary)


def kill_marked(mark: str) -> None:
    """Kill every process whose environment holds GPU_RUN_PART=mark (Linux: read from /proc)."""
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if f"GPU_RUN_PART={mark}".encode() in environ.read_bytes().split(b"\0"):
                os.kill(int(environ.parent.name), signal.SIGKILL)
        except OSError:
            pass


def run_part(out: Path, command: list[str], limit_s: float, env: dict) -> dict:
    """`command` in a process group of its own, its output appended to the log; killed, with everything it started
    (a kernel too), once limit_s have passed."""
    start = time.monotonic()
    with open(out / "gpu_run.log", "a", encoding="utf-8") as log_file:
        log_file.write(f"$ {' '.join(command)}   (limit {limit_s:.0f} s)\n")
        log_file.flush()
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        try:
            rc = process.wait(timeout=max(limit_s, 1))
            status = "ok" if rc == 0 else f"failed: exit {rc}"
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)  # a process stuck in the driver must not hold up the parts after it
            kill_marked(env["GPU_RUN_PART"])  # a Jupyter kernel runs in a session of its own
            status = f"timed out after {limit_s:.0f} s"
    result = {"status": status, "wall_s": round(time.monotonic() - start, 1)}
    if status != "ok":
        result["log_tail"] = (out / "gpu_run.log").read_text(encoding="utf-8", errors="replace")[-2000:]
    return result


def setup(dry: bool) -> dict:
    """Install the carried wheels if a package the notebook or nbclient needs is missing, with a python3 kernel that
    finds them (PYTHONPATH, which the parts inherit); describe the machine, returned."""
    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count()}
    missing = [name for name in MISSING_ON_DEVICE if importlib.util.find_spec(name) is None]
    wheels = sorted((PREPARED / "wheels").glob("*.whl"))
    if missing:
        if not wheels:
            raise RuntimeError(f"{', '.join(missing)} missing and no wheels in {PREPARED / 'wheels'}: run "
                               "tests/tools/gpu_prepare.sh here and carry .gpu")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--no-cache-dir", "--upgrade", "--target", str(SITE), *map(str, wheels)], check=True)
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SITE), os.environ.get("PYTHONPATH")]))
        os.environ["PATH"] = os.pathsep.join([str(SITE / "bin"), os.environ["PATH"]])
        sys.path.insert(0, str(SITE))
        info["installed"] = missing
        kernel = subprocess.run([sys.executable, "-m", "ipykernel", "install", "--user", "--name", "python3"],
                                capture_output=True, text=True, check=False)  # its python finds /tmp/site (PYTHONPATH)
        if kernel.returncode:
            raise RuntimeError(f"ipykernel install exited {kernel.returncode}: {kernel.stderr[-1500:]}")
    if torch.cuda.is_available():
        info["gpu"], info["nvidia_smi"] = torch.cuda.get_device_name(0), nvidia_smi()
    elif not dry:
        raise RuntimeError("no CUDA GPU here: on a CPU use --dry-run")
    return info


def nvidia_smi() -> str:
    """The GPU's name, memory and driver by nvidia-smi; without nvidia-smi, why not (the run goes on without it)."""
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, check=False, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError) as error:
        return f"not read: {type(error).__name__}: {error}"


def fp16_from_checkpoint(work: Path, path: Path) -> None:
    """If the fp16 part left no report (killed at its limit), what its last checkpoint holds, into `path`: the steps,
    the skipped steps, the scaler's scale and the history so far; no BLEU."""
    if path.exists() or (last := common.newest(work, "last.pt")) is None:
        return
    import torch

    ckpt = torch.load(last, map_location="cpu", weights_only=True)
    state = ckpt["state"]
    common.write_json(path, {"error": "the part did not finish: its last checkpoint's figures, no BLEU",
                             "steps": state["step"], "epochs": state["epoch"],
                             "train_min": round(state["seconds"] / 60, 2), "skipped_steps": state["skipped_steps"],
                             "scaler_scale": ckpt["scaler"].get("scale"), "history": state["history"]})


def data_folder(name: str, dry: bool) -> str:
    """The carried copy of ../shared/data/<name>; a dry run: the repository's slice of it in tests/data."""
    folder = (ROOT / "tests" / "data" if dry else PREPARED / "data") / name
    if not folder.is_dir():
        raise FileNotFoundError(f"no {name} data in {folder.parent}: run tests/tools/gpu_prepare.sh and carry .gpu")
    return str(folder)


def fp16_notebook(nb, settings: dict | None = None):
    """The notebook down to section 11's evaluation cell, without the `# [slow]` cells other than the training and
    evaluation cells (demonstrations: the copy task, plots, a translation), fp16 forced (FORCE_FP16 after the cell
    defining autocast_dtype), the REPORT cell at the end; with settings, section 1's cfg line made to use them."""
    import nbformat

    defining = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"
                and re.search(r"^def autocast_dtype\(", c.source, re.MULTILINE)]
    if len(defining) != 1:
        raise LookupError(f"{len(defining)} code cells define autocast_dtype, not one: update gpu_run.py")
    needed = {common.training_cell(nb), common.evaluation_cell(nb)}  # the other `# [slow]` cells only demonstrate
    cells = []
    for i, cell in enumerate(nb.cells[: max(needed) + 1]):
        if i in needed or not common.is_slow(cell):
            cells.append(cell)
        if i == defining[0]:
            cells.append(nbformat.v4.new_code_cell(FORCE_FP16))
    nb.cells = [*cells, nbformat.v4.new_code_cell(REPORT)]
    return common.with_settings(nb, settings) if settings else nb


def report(text: str) -> dict | None:
    """The GPU_RUN_JSON line of an executed notebook's output."""
    lines = [line for line in text.splitlines() if line.startswith("GPU_RUN_JSON ")]
    return json.loads(lines[-1].split(" ", 1)[1]) if lines else None


def execute_notebook(preset: str, work: str, data_dir: str, out: Path, notebook: str, fp16: bool, dry: bool) -> int:
    """A notebook part's process: the whole notebook (fp16: fp16_notebook), saved after every cell; the fp16 part's
    report to out (the bf16 run's files are copied by main, which does so even when this process is killed)."""
    nb = common.read_notebook(Path(notebook))
    name = f"transformer-{preset}" + ("-fp16" if fp16 else "")
    if fp16:
        nb = fp16_notebook(nb, DRY_FP16_SETTINGS if dry else None)
    try:
        common.execute_notebook(nb, common.notebook_env(preset, work, data_dir or None), ROOT, out / f"{name}.ipynb")
    finally:
        if fp16:
            common.write_json(out / f"{preset}-fp16.json", report(common.stream_text(nb)) or {"error": "no report"})
    return 0


def side_by_side(out: Path, preset: str) -> dict:
    """The BLEU rows of the bf16 run (results.json) beside the fp16 run's, by weights and decoding."""
    try:
        bf16 = json.loads((out / "results.json").read_text())["bleu"]
        fp16 = json.loads((out / f"{preset}-fp16.json").read_text())["bleu"]
    except (OSError, KeyError, TypeError, ValueError) as error:
        return {"error": f"{type(error).__name__}: {error}"}
    return {row: {"bf16": bf16.get(row), "fp16": fp16.get(row)} for row in sorted({*bf16, *fp16})}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.execute_notebook:
        return execute_notebook(*args.execute_notebook, out, args.notebook, args.fp16, args.dry_run)
    ends_at = time.monotonic() + args.budget_s
    skip = set(filter(None, args.skip.split(",")))
    commit = common.current_commit()
    summary: dict = {"command": "python3 tests/tools/gpu_run.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                     "commit": commit, "dry_run": args.dry_run,
                     "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "parts": {}}
    log(out, f"[gpu_run] {summary['date']} commit {commit or '?'}, budget {args.budget_s:.0f} s")
    start = time.monotonic()
    try:
        summary["machine"] = setup(args.dry_run)
        summary["parts"]["setup"] = {"status": "ok", "wall_s": round(time.monotonic() - start, 1)}
    except Exception as error:  # noqa: BLE001 - say what failed, in the summary that comes back
        summary["parts"]["setup"] = {"status": f"failed: {type(error).__name__}: {error}"[:2000]}
        write_summary(out, summary)
        log(out, f"[gpu_run] setup failed: {error}")
        return 1
    log(out, f"[gpu_run] setup: {json.dumps(summary['machine'])}")
    write_summary(out, summary)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TRANSFORMER_PROGRESS": "0", "MPLBACKEND": "Agg"}
    preset, work = ("smoke" if args.dry_run else "multi30k"), tempfile.mkdtemp(prefix="gpu_run-")
    data = "" if args.dry_run else data_folder("multi30k", False)  # a dry run: the slice the smoke preset finds
    notebook = [sys.executable, __file__, str(out), *(["--dry-run"] if args.dry_run else []), "--execute-notebook",
                preset]
    parts = {
        "notebook": ([*notebook, str(Path(work) / "bf16"), data, "--notebook", args.notebook],
                     None if args.dry_run else NOTEBOOK_LIMIT_S),
        "notebook_fp16": ([*notebook, str(Path(work) / "fp16"), data, "--notebook", str(common.NOTEBOOK), "--fp16"],
                          None if args.dry_run else FP16_LIMIT_S),
        "gpu_check": ([sys.executable, str(ROOT / "tests" / "tools" / "gpu_check.py"), "--out", str(out),
                       *(["--dry-run"] if args.dry_run else []),
                       "--multi30k-dir", data_folder("multi30k", args.dry_run),
                       "--iwslt14-dir", data_folder("iwslt14/hub", args.dry_run), "--deadline-at", "DEADLINE"], None),
    }
    for name, (command, limit) in parts.items():
        if name in skip:
            continue
        left = ends_at - RESERVE_S - time.monotonic()
        limit = left if limit is None else min(limit, left)
        command = [str(round(time.time() + left - 10)) if c == "DEADLINE" else c for c in command]  # before us
        log(out, f"[gpu_run] {name} (limit {limit:.0f} s) ...")
        marked = {**env, "GPU_RUN_PART": f"{name}-{os.getpid()}"}
        summary["parts"][name] = run_part(out, command, limit, marked) if limit > 5 else {"status": "not run: no time"}
        if name == "notebook":  # the files its run wrote, even if it was killed at its limit
            common.keep_run_files(Path(work) / "bf16", out)
        if name == "notebook_fp16":
            fp16_from_checkpoint(Path(work) / "fp16", out / f"{preset}-fp16.json")
        log(out, f"[gpu_run] {name}: {summary['parts'][name]['status']} in {summary['parts'][name].get('wall_s')} s")
        write_summary(out, summary)
    shutil.rmtree(work, ignore_errors=True)
    for leftover in out.glob("*.tmp"):  # a file a killed part was writing (common.write_text): not one of the 8
        leftover.unlink(missing_ok=True)
    summary["fp16_vs_bf16"] = side_by_side(out, preset)
    summary["wall_s"] = round(time.monotonic() - start, 1)
    write_summary(out, summary)
    log(out, f"[gpu_run] done in {summary['wall_s']} s: " + ", ".join(f"{k} {v['status']}"
                                                                     for k, v in summary["parts"].items()))
    return 0 if all(v["status"] == "ok" for v in summary["parts"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
