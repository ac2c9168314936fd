"""STS evaluation (provisional: the full harness replaces this module; its API stays)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

from training.data import find_source_dir, read_stsb


def stsb_dev_spearman(encode: Callable[[list[str]], np.ndarray], data_dir: str | Path | None) -> float:
    """Spearman × 100 of cosine similarity on STS-B dev (1,500 pairs)."""
    if data_dir is None:
        raise ValueError("STS-B dev needs a data_dir")
    pairs = read_stsb(find_source_dir("stsb", data_dir), "dev")
    a = encode([" ".join(p.sentence1.split()) for p in pairs])
    b = encode([" ".join(p.sentence2.split()) for p in pairs])
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return float(100 * spearmanr(cos, [p.label for p in pairs]).correlation)
