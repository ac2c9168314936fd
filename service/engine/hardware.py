"""What this machine's CPU offers: the cores to run on (the onnx backend's thread count) and its feature flags (what
the benchmarks report the machine by). Probing, not a backend: it lives beside the backends, not among them."""

from __future__ import annotations

import os
from pathlib import Path


def physical_cores(sysfs: Path = Path("/sys/devices/system/cpu")) -> int:
    """Cores this process may run on, hyper-threads counted once (onnxruntime's own default count)."""
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    cores: set[tuple[str, str] | int] = set()
    for cpu in cpus:
        topology = sysfs / f"cpu{cpu}" / "topology"
        try:
            cores.add(((topology / "physical_package_id").read_text(), (topology / "core_id").read_text()))
        except OSError:
            cores.add(cpu)  # no topology to read (not Linux, or a restricted /sys): count it as a core
    return max(len(cores), 1)


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

