"""What this machine's CPU offers: the cores to run on (the onnx backend's thread count, the API processes' count)
and its feature flags (what the benchmarks report the machine by). The cores are what this process may use: its
CPU affinity, and a cgroup's CPU quota (Kubernetes' `resources.limits.cpu`, `docker run --cpus`), which a count
of the machine's cores ignores: 16 onnxruntime threads under a 4-CPU quota are throttled, not faster."""

from __future__ import annotations

import os
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")
SELF_CGROUP = Path("/proc/self/cgroup")


def _affinity() -> set[int]:
    return os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))


def physical_cores(sysfs: Path = Path("/sys/devices/system/cpu"), cgroup: Path = CGROUP,
                   self_cgroup: Path = SELF_CGROUP) -> int:
    """Cores this process may run on, hyper-threads counted once (onnxruntime's own default count), at most its
    cgroup's CPU quota (rounded down: a thread more than the quota is throttled in every pass)."""
    cores: set[tuple[str, str] | int] = set()
    for cpu in _affinity():
        topology = sysfs / f"cpu{cpu}" / "topology"
        try:
            cores.add(((topology / "physical_package_id").read_text(), (topology / "core_id").read_text()))
        except OSError:
            cores.add(cpu)  # no topology to read (not Linux, or a restricted /sys): count it as a core
    return _within_quota(len(cores), cgroup, self_cgroup)


def usable_cpus(cgroup: Path = CGROUP, self_cgroup: Path = SELF_CGROUP) -> int:
    """Logical CPUs this process may run on (its affinity), at most its cgroup's CPU quota."""
    return _within_quota(len(_affinity()), cgroup, self_cgroup)


def _within_quota(count: int, cgroup: Path, self_cgroup: Path) -> int:
    quota = cpu_quota(cgroup, self_cgroup)
    return max(1, count if quota is None else min(count, int(quota)))


def cpu_quota(cgroup: Path = CGROUP, self_cgroup: Path = SELF_CGROUP) -> float | None:
    """The CPUs this process's cgroups allow it (quota over period), the tightest of its cgroup and those above it;
    None where none is set or the system does not say. cgroup v2 (`cpu.max`), else v1 (`cpu.cfs_quota_us`)."""
    try:
        lines = self_cgroup.read_text().splitlines()
    except OSError:
        return None
    limits = []
    for line in lines:
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue  # not a cgroup line: nothing to read from it
        _, controllers, path = fields
        if controllers == "":  # v2: one hierarchy, mounted at the cgroup root
            limits += [_v2_limit(d / "cpu.max") for d in _up_from(cgroup, path)]
        elif "cpu" in controllers.split(","):  # v1: the cpu controller's own mount (named by its controllers)
            for mount in {cgroup / controllers, cgroup / "cpu"}:
                limits += [_v1_limit(d) for d in _up_from(mount, path)]
    known = [limit for limit in limits if limit is not None]
    return min(known) if known else None


def _up_from(mount: Path, path: str) -> list[Path]:
    """`mount`/`path` and every folder above it up to `mount` (in a container the mount is its own cgroup)."""
    relative = Path(path.strip("/"))
    return [mount / p for p in (relative, *relative.parents)]  # Path("a/b").parents: "a", "."


def _v2_limit(cpu_max: Path) -> float | None:
    try:
        quota, period = cpu_max.read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError, ZeroDivisionError):
        return None


def _v1_limit(folder: Path) -> float | None:
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text())
        return None if quota <= 0 else quota / int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError, ZeroDivisionError):
        return None


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str] | None:
    """The CPU's feature flags (x86 "flags", ARM "Features"), None where the system does not say (not Linux)."""
    value = cpuinfo_field(("flags", "Features"), cpuinfo)
    return None if value is None else set(value.split())


def cpuinfo_field(names: tuple[str, ...], cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The first CPU's value of the first of `names` in /proc/cpuinfo; None where there is none (not Linux)."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith(names):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None

