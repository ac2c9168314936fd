"""What differs between model families, one module each (as TEI's backends/candle/src/models/): how far the
position table reaches, what a plain Hugging Face checkpoint pools by, how the model is loaded and traced.

`family_of(config)` finds a config's family by its model_type; a model_type no module names gets `GENERIC`,
the base `Family`'s defaults (a bidirectional encoder pooled by its mean). Conditions on model_type live here,
nowhere else.
"""

from __future__ import annotations

from core.families.base import Family
from core.families.bert import BERT
from core.families.decoder import DECODER
from core.families.gemma3 import GEMMA3
from core.families.modernbert import MODERNBERT
from core.families.roberta import ROBERTA

FAMILIES: tuple[Family, ...] = (BERT, ROBERTA, MODERNBERT, DECODER, GEMMA3)
_BY_TYPE = {model_type: family for family in FAMILIES for model_type in family.model_types}
GENERIC = Family("encoder", ())


def family_of(config) -> Family:
    return _BY_TYPE.get(getattr(config, "model_type", ""), GENERIC)


__all__ = ["FAMILIES", "Family", "family_of"]
