"""Registry: `METHOD` name → objective class, and its settings from key=values. Imports are lazy so one
broken optional dependency (WordNet for ConIsI-o2, say) does not take every method down."""

from __future__ import annotations

from collections.abc import Mapping
from importlib import import_module
from typing import Any

from training.objectives.base import Objective, ObjectiveSettings

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


def make_settings(method: str, values: Mapping[str, Any] | ObjectiveSettings) -> ObjectiveSettings:
    """`method`'s settings dataclass: the paper's defaults with `values` (a preset's, --objective's) over them."""
    settings_type = get_objective(method).settings_type
    if isinstance(values, ObjectiveSettings):
        if not isinstance(values, settings_type):
            raise ValueError(f"{method} takes {settings_type.__name__}, not {type(values).__name__}")
        return values
    return settings_type.from_dict(values)
