"""A model family's quirks as data and a few overridable steps; the defaults suit a bidirectional encoder."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Family:
    name: str
    #: transformers' config.model_type values this family covers
    model_types: tuple[str, ...]
    #: a plain HF checkpoint (no sentence-transformers modules) pools by this
    default_pooling: str = "mean"
    #: onnxruntime.transformers' optimizer model_type whose fusions the int8 and fp16 variants start from
    #: (None: they are built from the plain graph)
    ort_fusion: str | None = "bert"
    #: RMSNorm layers, which transformers computes in float32 whatever the model's dtype: the fp16 variant
    #: keeps them so
    rms_norm: bool = False

    def load_kwargs(self, config) -> dict[str, Any]:
        """Extra keyword arguments for AutoModel.from_pretrained."""
        return {}

    def position_limit(self, config) -> int | None:
        """The longest input the position table holds (None: the config states no limit)."""
        limit = getattr(config, "max_position_embeddings", None)
        return limit if isinstance(limit, int) and limit > 0 else None

    def checked_limit(self, config, asked: int | None) -> int | None:
        """`position_limit`, after refusing an `asked` max_seq_length past it (a ValueError naming the limit)."""
        limit = self.position_limit(config)
        if asked and limit and asked > limit:
            raise ValueError(f"max_seq_length {asked} is past {config.model_type}'s position table: it takes at "
                             f"most {limit} tokens")
        return limit

    def prepare(self, model) -> None:
        """Anything the model needs before it is run or traced (in place)."""
