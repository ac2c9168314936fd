"""What the CPU offers the backend: the cores to run on, and which of an export's int8 graphs runs best on it."""

from __future__ import annotations

import os
import platform
from collections.abc import Collection
from pathlib import Path

#: x86 flags of int8 dot-product instructions: with them onnxruntime's int8 GEMMs run about twice as fast as with
#: AVX2 alone, and the export's by-blocks int8 graph is the faster one (training.quantize.INT8_GRAPHS)
VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})


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


def is_x86(machine: str) -> bool:
    return machine.lower() in ("x86_64", "amd64", "i386", "i686")


def int8_for_this_cpu(variants: Collection[str]) -> str | None:
    """`int8_for_cpu` on this machine's CPU."""
    return int8_for_cpu(variants, cpu_flags(), platform.machine())


def int8_for_cpu(variants: Collection[str], flags: set[str] | None, machine: str) -> str | None:
    """Which of the export's int8 graphs to serve on a CPU, None if it has neither: "int8-avx2" (row-scaled
    per-channel int8 feed-forward outputs where "int8" has blocks) on an x86 CPU known to lack VNNI, where it was the
    faster in 3 of 4 side-by-side figures (short and long texts, two runs; RESULTS.md) at the same cosine; "int8"
    anywhere else, where it was measured faster (VNNI) or nothing was measured (ARM). Either one when it is the only
    one: each gives its recorded vectors on every x86 CPU."""
    without_vnni = flags is not None and is_x86(machine) and not flags & VNNI_FLAGS
    order = ("int8-avx2", "int8") if without_vnni else ("int8", "int8-avx2")
    return next((v for v in order if v in variants), None)
