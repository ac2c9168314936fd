"""Search on a GPU for Flat and IVF collections, when FAISS has GPU support and a GPU is present.

SEMBED_INDEX_GPU=auto (the default) uses GPU 0 when `faiss` has StandardGpuResources and reports a GPU
(`faiss.get_num_gpus() > 0`, i.e. the faiss-gpu-cuvs wheel of the `gpu` extra on a machine with CUDA);
`off` never does. HNSW has no GPU form in FAISS and stays on the CPU.

The CPU side stays the source of truth (slot array, IVF structure, tombstones, filters); a VectorSet
keeps a GPU copy beside it (`faiss.index_cpu_to_gpu`): of its IVF structure, and for Flat an exact
IndexFlatIP whose positions are slots. The copy answers unfiltered searches only: it is asked for k
plus the number of dead slots it holds, and the dead are dropped, so it needs no ID selector; a
filtered search, or one with more tombstones than a GPU search may return, runs on the CPU.
"""

from __future__ import annotations

import logging
import threading

import faiss

log = logging.getLogger("sembed.index")

MODES = ("auto", "off")
MAX_K = 2048  # the most results a FAISS GPU search returns per query
_resources = None
_lock = threading.Lock()


def available() -> bool:
    """FAISS was built with GPU support and sees at least one GPU."""
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def resources(mode: str):
    """The process's StandardGpuResources when `mode` is auto and a GPU is there, else None (CPU)."""
    if mode not in MODES:
        raise ValueError(f"index GPU mode {mode!r}: use auto or off")
    if mode == "off" or not available():
        return None
    global _resources
    with _lock:
        if _resources is None:
            _resources = faiss.StandardGpuResources()
        return _resources


def copy_to_gpu(res, index):
    """A GPU copy of a CPU index (Flat or IVF) on device 0; None (the CPU answers) when FAISS cannot
    make one (e.g. IVF-PQ with codes of fewer than 8 bits)."""
    try:
        return faiss.index_cpu_to_gpu(res, 0, index)
    except Exception as e:  # a FAISS error, or out of GPU memory: search stays on the CPU
        log.warning("index structure not copied to the GPU (%s): searching it on the CPU", e)
        return None
