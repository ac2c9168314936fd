"""Independent numpy versions of the losses the objectives share, for the tests to compare against."""

import numpy as np


def np_info_nce(q: np.ndarray, k: np.ndarray, tau: float) -> float:
    """InfoNCE with in-batch negatives: row i of q against every row of k, positive on the diagonal."""
    q = q / np.linalg.norm(q, axis=1, keepdims=True)
    k = k / np.linalg.norm(k, axis=1, keepdims=True)
    logits = q @ k.T / tau
    logits = logits - logits.max(axis=1, keepdims=True)
    log_softmax = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    return float(-np.mean(np.diag(log_softmax)))
