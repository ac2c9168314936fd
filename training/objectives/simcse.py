"""Unsupervised SimCSE (Gao et al., 2021, "SimCSE: Simple Contrastive Learning of Sentence
Embeddings", §3), the baseline ConIsI (§4.4, Table 4) and the other papers compare against.

Each sentence x_i is encoded twice; the two passes see different dropout masks (the loop calls
train()), which is the only augmentation:

    h_i = MLP(enc(x_i; dropout z)),  h_i⁺ = MLP(enc(x_i; dropout z'))     MLP = tanh(W·h + b)
    ℓ_i = −log  e^{sim(h_i, h_i⁺)/τ} / Σ_j e^{sim(h_i, h_j⁺)/τ}             (SimCSE Eq. 3, τ = 0.05)

sim is cosine similarity; the negatives h_j⁺ (j ≠ i) are the other sentences' second views, gathered
from all GPUs. The MLP is used in training only ("mlp_only_train", SimCSE §3 and its unsupervised
recipe); evaluation and export use the encoder's raw [CLS] (pooling "cls").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from core.encoder import SentenceEncoder, model_inputs
from training.objectives.base import Objective, ObjectiveSettings
from training.objectives.losses import info_nce


@dataclass(frozen=True)
class SimCSESettings(ObjectiveSettings):
    """SimCSE's settings (`--objective key=value`); the defaults are the paper's, see SimCSE."""

    temperature: float = 0.05
    pooling: str | None = "cls"
    max_length: int | None = 32
    mlp_only_train: bool = True


class SimCSE(Objective):
    """forward: z = MLP(enc([x; x]))      (one pass over 2B rows: two independent dropout masks)
                loss = info_nce(z[:B], z[B:], τ)

    Settings (SimCSESettings, paper defaults): temperature 0.05; pooling "cls"; max_length 32 (SimCSE's unsupervised
    max_seq_length; capped by the encoder's own limit); mlp_only_train True — False keeps the MLP
    at inference too (SimCSE's supervised setting), as the exported encoder's head.
    """

    name: ClassVar[str] = "simcse"
    data_kind: ClassVar[str] = "unlabeled"
    settings_type: ClassVar[type[ObjectiveSettings]] = SimCSESettings
    #: GradCache layout (training/gradcache.py): features and embeddings both stack [x; x]
    row_groups: ClassVar[dict[str, int]] = {"features": 2}
    embed_groups: ClassVar[int] = 2

    def __init__(self, encoder: SentenceEncoder, settings: SimCSESettings | None = None):
        settings = settings or SimCSESettings()
        super().__init__(encoder, settings)
        self.temperature = settings.temperature
        if settings.pooling is not None:
            encoder.pooling = settings.pooling
        self.max_length = min(settings.max_length or encoder.max_seq_length, encoder.max_seq_length)
        self.mlp_only_train = settings.mlp_only_train
        d = encoder.dim
        self.mlp = nn.Sequential(nn.Linear(d, d), nn.Tanh())

    def collate(self, examples: list[str]) -> dict[str, Any]:
        features = self.encoder.tokenize(list(examples) * 2, max_length=self.max_length)
        return {"features": model_inputs(features)}

    def loss_from_embeddings(self, z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        """InfoNCE between two views' pooled embeddings, after the MLP."""
        return info_nce(self.mlp(z1), self.mlp(z2), self.temperature)

    def embed(self, batch: dict[str, Any]) -> torch.Tensor:
        return self.encoder(**batch["features"])

    def forward(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        return self.loss_from_embedded(self.embed(batch), batch)

    def loss_from_embedded(self, pooled: torch.Tensor, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        z1, z2 = pooled.chunk(2)
        loss = self.loss_from_embeddings(z1, z2)
        with torch.no_grad():
            pos_cos = F.cosine_similarity(z1.float(), z2.float(), dim=-1).mean()
        return {"loss": loss, "pos_cos": pos_cos}

    def inference_encoder(self) -> SentenceEncoder:
        if self.mlp_only_train:
            return self.encoder
        if self.encoder.head is not None:
            raise ValueError("mlp_only_train=False needs an encoder without a head of its own")
        enc = self.encoder
        return SentenceEncoder(
            enc.transformer, enc.tokenizer, enc.pooling, enc.max_seq_length, head=self.mlp, base_model=enc.base_model
        )
