"""BERT and its kin that number positions from 0: the embedding model is BertModel without its pooler (the
[CLS] dense + tanh belongs to sequence classification, which a sentence-transformers Transformer never runs)."""

from __future__ import annotations

from typing import Any

from core.families.base import Family


class _Bert(Family):
    def load_kwargs(self, config) -> dict[str, Any]:
        return {"add_pooling_layer": False}


BERT = _Bert("bert", ("bert",))
