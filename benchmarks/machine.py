"""The machine a benchmark ran on (every benchmark prints it: speeds move with the CPU), and its processes."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import signal
import subprocess
import sys
from pathlib import Path

from service.hardware import cpu_flags, cpuinfo_field

FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "amx_tile")


def cpu_line() -> str:
    """CPU model, cores, the SIMD flags that matter to onnxruntime and FAISS, Python, load average."""
    model = cpuinfo_field(("model name",)) or platform.processor() or "unknown CPU"
    flags = cpu_flags() or set()
    shown = [f for f in FLAGS if f in flags]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"CPU: {model}; {os.cpu_count()} cores; flags: {' '.join(shown) or 'none of avx2/avx512'}; "
            f"python {platform.python_version()}; load average {load:.1f} at start")


def finish(checks: list[tuple[str, bool]], results: dict, out: Path | None) -> int:
    """Print the PASS/FAIL lines, keep the figures and the verdicts as JSON; the exit status says if all passed."""
    for text, ok in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {text}")
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        # what RESULTS.md cites a figure with: the command, when, and at which commit
        results.setdefault("command", " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]))
        results.setdefault("date", datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"))
        results.setdefault("commit", git_commit())
        results["checks"] = {text: ok for text, ok in checks}
        out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    return 0 if all(ok for _, ok in checks) else 1


def git_commit() -> str:
    """The repository's HEAD, short ("unknown" outside a git checkout)."""
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).resolve().parent.parent,
                              capture_output=True, text=True, check=True).stdout.strip()
    return "unknown"


TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids) -> dict[int, float]:
    """utime + stime of each process (all its threads), seconds; a process gone meanwhile is left out."""
    out = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[pid] = (int(fields[11]) + int(fields[12])) / TICKS  # fields 14 and 15 of proc(5)
    return out


def process_tree(root: int) -> dict[int, str]:
    """pid → title of `root` and every process under it (ppid links from /proc, as `ps` reads them)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):  # gone meanwhile
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = {}, [root]
    while todo:
        pid = todo.pop()
        try:  # setproctitle rewrites argv: "sembed: api 1"
            tree[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:
            continue
        todo += parents.get(pid, [])
    return tree


def stop(proc: subprocess.Popen, grace_s: float = 30) -> None:
    """SIGTERM (a service drains, then exits), SIGKILL if it has not exited after `grace_s`."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
