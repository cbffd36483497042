"""A GPU session's measuring, in one command and one device call: the whole notebook on the multi30k preset, then every
phase of gpu_check.py, each part within its own time limit and all within --budget-s. First run on an H100 on
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
2. notebook: transformer.ipynb on the multi30k preset (a dry run: smoke), executed by nbclient in a kernel and saved
   after every cell into OUT/transformer-<preset>.ipynb, so that a run cut short keeps what it did; the run's
   results.json and history.json copied to OUT.
3. gpu_check: `tests/tools/gpu_check.py` (its own phases, each with its own limit) into OUT/<device>.json.
A part that fails or runs out of time records its error in OUT/gpu_run.json and the next part runs; the whole log is
OUT/gpu_run.log. Six files in all: the device tool brings back at most 8.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # tests/tools/gpu_run.py: the repository root
sys.path[:0] = [str(ROOT / "tests" / "tools"), str(ROOT / "tests")]  # gpu_check beside this file, nbloader in tests/
import gpu_check

PREPARED = ROOT / ".gpu"  # made by gpu_prepare.sh, ignored by git, carried to the device
SITE = Path("/tmp/site")  # where the carried wheels are installed on the device
MISSING_ON_DEVICE = ("datasets", "nbformat", "nbclient", "ipykernel")
NOTEBOOK_LIMIT_S = 450  # on a GPU: the multi30k preset took 136 s in all on an H100 (2026-11-26); room for slower GPUs
# (a dry run has only --budget-s, so that a slow CPU cannot fail it)
RESERVE_S = 15  # kept back at the end for writing the summary


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="folder for the files that come back ($OUT on the device)")
    p.add_argument("--dry-run", action="store_true", help="on a CPU: every part at smoke sizes")
    p.add_argument("--budget-s", type=float, default=555.0, help="seconds for all the parts (default 9.25 minutes)")
    p.add_argument("--skip", default="", help="parts to leave out, comma-separated: notebook, gpu_check")
    p.add_argument("--notebook", default=str(ROOT / "transformer.ipynb"), help="the notebook the notebook part runs "
                   "(the tests give a copy with every code cell doubled: one kernel run for several tests)")
    p.add_argument("--execute-notebook", nargs=3, metavar=("PRESET", "WORK", "DATA_DIR"),
                   help=argparse.SUPPRESS)  # the notebook part's own process ('' for no data folder)
    return p.parse_args(argv)


def log(out: Path, text: str) -> None:
    print(text, flush=True)
    with open(out / "gpu_run.log", "a", encoding="utf-8") as f:
        f.write(text + "\n")


def write_summary(out: Path, summary: dict) -> None:
    gpu_check.write_json(out / "gpu_run.json", summary)


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
            process.wait()
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
        subprocess.run([sys.executable, "-m", "ipykernel", "install", "--user", "--name", "python3"], check=True,
                       capture_output=True)  # a kernel whose python finds /tmp/site (PYTHONPATH)
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True, check=False)
        info["nvidia_smi"] = smi.stdout.strip()
    elif not dry:
        raise RuntimeError("no CUDA GPU here: on a CPU use --dry-run")
    return info


def data_folder(name: str, dry: bool) -> str:
    """The carried copy of ../shared/data/<name>; a dry run: the repository's slice of it in tests/data."""
    folder = (ROOT / "tests" / "data" if dry else PREPARED / "data") / name
    if not folder.is_dir():
        raise FileNotFoundError(f"no {name} data in {folder.parent}: run tests/tools/gpu_prepare.sh and carry .gpu")
    return str(folder)


def execute_notebook(preset: str, work: str, data_dir: str, out: Path, notebook: str) -> int:
    """The notebook part's process: the whole notebook, saved after every cell; results copied to out."""
    os.environ["TRANSFORMER_PROGRESS"] = "0"
    os.environ.setdefault("MPLBACKEND", "Agg")
    work_dir = Path(work)
    try:
        gpu_check.execute_notebook(preset, work_dir, data_dir or None, out / f"transformer-{preset}.ipynb",
                                   Path(notebook))
    finally:
        for name in ("results.json", "history.json"):
            if (work_dir / name).is_file():
                shutil.copyfile(work_dir / name, out / name)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.execute_notebook:
        return execute_notebook(*args.execute_notebook, out, args.notebook)
    ends_at = time.monotonic() + args.budget_s
    skip = set(filter(None, args.skip.split(",")))
    commit = gpu_check.current_commit()
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
    parts = {  # a dry run's notebook finds the repository's Multi30k slice itself, as a user's smoke run does
        "notebook": ([sys.executable, __file__, str(out), "--notebook", args.notebook, "--execute-notebook", preset,
                      work, "" if args.dry_run else data_folder("multi30k", False)],
                     None if args.dry_run else NOTEBOOK_LIMIT_S),
        "gpu_check": ([sys.executable, str(ROOT / "tests" / "tools" / "gpu_check.py"), "--out", str(out),
                       *(["--dry-run", "--skip", "notebook"] if args.dry_run else []),
                       "--multi30k-dir", data_folder("multi30k", args.dry_run),
                       "--iwslt14-dir", data_folder("iwslt14/hub", args.dry_run), "--deadline-s", "DEADLINE"], None),
    }
    for name, (command, limit) in parts.items():
        if name in skip:
            continue
        left = ends_at - RESERVE_S - time.monotonic()
        limit = left if limit is None else min(limit, left)
        command = [str(round(left - 10)) if c == "DEADLINE" else c for c in command]  # its phases end before us
        log(out, f"[gpu_run] {name} (limit {limit:.0f} s) ...")
        marked = {**env, "GPU_RUN_PART": f"{name}-{os.getpid()}"}
        summary["parts"][name] = run_part(out, command, limit, marked) if limit > 5 else {"status": "not run: no time"}
        log(out, f"[gpu_run] {name}: {summary['parts'][name]['status']} in {summary['parts'][name].get('wall_s')} s")
        write_summary(out, summary)
    shutil.rmtree(work, ignore_errors=True)
    summary["wall_s"] = round(time.monotonic() - start, 1)
    write_summary(out, summary)
    log(out, f"[gpu_run] done in {summary['wall_s']} s: " + ", ".join(f"{k} {v['status']}"
                                                                     for k, v in summary["parts"].items()))
    return 0 if all(v["status"] == "ok" for v in summary["parts"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
