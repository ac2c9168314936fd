"""Registry: `METHOD` name → objective class. Imports are lazy so one broken optional
dependency (WordNet for ConIsI-o2, say) does not take every method down."""

from __future__ import annotations

from importlib import import_module

from training.objectives.base import Objective

_REGISTRY = {
    "simcse": ("training.objectives.simcse", "SimCSE"),
    "conisi": ("training.objectives.conisi", "ConIsI"),
    "clsr": ("training.objectives.clsr", "CLSR"),
    "cosent": ("training.objectives.cosent", "CoSENT"),
    "cosent-cross": ("training.objectives.cosent", "CoSENTCrossEncoder"),  # a pair scorer, served at /rerank
    "infocse": ("training.objectives.infocse", "InfoCSE"),
}
METHODS = tuple(_REGISTRY)


def get_objective(method: str) -> type[Objective]:
    if method not in _REGISTRY:
        raise ValueError(f"unknown METHOD {method!r}; choose from {', '.join(METHODS)}")
    module, cls = _REGISTRY[method]
    return getattr(import_module(module), cls)
