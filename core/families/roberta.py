"""RoBERTa, XLM-R, CamemBERT and MPNet: position ids start after the padding index (padding_idx + 1 = 2), so
a table of 514 positions holds 512 tokens. Reading the table's size as the limit was an IndexError at 513."""

from __future__ import annotations

from typing import Any

from core.families.base import Family


class _Roberta(Family):
    def load_kwargs(self, config) -> dict[str, Any]:
        return {"add_pooling_layer": False} if config.model_type != "mpnet" else {}

    def position_limit(self, config) -> int | None:
        limit = super().position_limit(config)
        pad = getattr(config, "pad_token_id", None)
        offset = (1 if pad is None else pad) + 1
        return None if limit is None else limit - offset


ROBERTA = _Roberta("roberta", ("roberta", "xlm-roberta", "camembert", "mpnet", "xlm-roberta-xl"))
