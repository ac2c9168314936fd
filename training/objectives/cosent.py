"""CoSENT (Huang et al., "CoSENT: Consistent Sentence Embedding via Similarity Ranking", §III-B).

A ranking loss over the pairs of a batch: every pair whose label is higher must get a higher score
than every pair whose label is lower,

    L = log(1 + Σ_{sim(i,j) > sim(k,l)} exp(λ (s(k,l) − s(i,j))))          (Eq. 10)

with s = cos(u_i, u_j) of siamese sentence embeddings (Eq. 8 for binary labels, Eq. 10 for any
sortable label: STS scores, 0/1, NLI as contradiction 0 < neutral 1 < entailment 2), or s = f(i, j),
the logit of a cross-encoder (Eq. 11). λ = 20 for every dataset (§IV-C). Ties never contribute,
so a batch whose labels are all equal has loss exactly log(1) = 0 and no gradient. Batches are plain
shuffles by default, as in the paper's code (at batch 16+ an all-equal batch is rare); the
"mixed_labels" batch sampler (training/sampling.py) is an option (`batch_sampler`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from core.cross_encoder import CrossEncoder
from core.data import ScoredPair
from core.encoder import SentenceEncoder, model_inputs
from training.distributed import gather_with_grad, is_distributed
from training.objectives.base import Objective, ObjectiveSettings
from training.sampling import SAMPLERS


def cosent_loss(scores: torch.Tensor, labels: torch.Tensor, scale: float = 20.0) -> torch.Tensor:
    """Eq. 10 / 11 for one batch: scores [N] (cosines or logits), labels [N] (any sortable value).

    The sum runs over ordered pairs (a, b) with labels[a] > labels[b] (strictly: ties are skipped),
    each term exp(λ (scores[b] − scores[a])); the leading 1 is the e^0 term of the log-sum-exp.
    O(N²) memory, which is nothing at the paper's batch sizes (16 and 64).
    """
    if scores.dtype in (torch.float16, torch.bfloat16):
        scores = scores.float()  # exp(λ·Δ) with λ = 20 needs more than half precision
    scores = scores * scale
    labels = labels.to(scores.device)
    higher = labels[:, None] > labels[None, :]  # [a, b]: pair a must out-score pair b
    diffs = (scores[None, :] - scores[:, None])[higher]  # λ(s_b − s_a) for each ranked (a, b)
    return torch.logsumexp(torch.cat([scores.new_zeros(1), diffs]), dim=0)


def _gathered_loss(scores: torch.Tensor, labels: torch.Tensor, scale: float) -> torch.Tensor:
    """Rank the pairs of all GPUs together, as one big batch would be ranked.

    Every rank computes the same global loss; the autograd gather sums the world's identical
    gradients into each rank's own scores (world × its share), and DDP's average over ranks divides
    that back: exactly the single-process gradient of the global batch. Identity on one process.
    """
    if not is_distributed():
        return cosent_loss(scores, labels, scale)
    scores = gather_with_grad(scores)
    labels = gather_with_grad(labels.to(scores.dtype).contiguous())
    return cosent_loss(scores, labels, scale)


@dataclass(frozen=True)
class CoSENTSettings(ObjectiveSettings):
    """CoSENT's settings (`--objective key=value`); the defaults are the paper's, see CoSENT."""

    scale: float = 20.0
    pooling: str | None = "mean"
    batch_sampler: str | None = None


class CoSENT(Objective):
    """Siamese CoSENT (§III-B, Fig. 2a): each side embedded separately by the shared encoder.

    forward: u, v = encoder(sentence1), encoder(sentence2)   (one pass over the 2B sentences)
             s = cos(u, v)                                   (un-normalised pooled embeddings)
             loss = cosent_loss(s, label, λ)                 (Eq. 10; Eq. 8 for 0/1 labels)

    `pooling`: the paper uses mean pooling in its supervised experiments (§IV-C, Table VIII), and
    first-last (BERT) / CLS (RoBERTa) for its NLI-only runs; None keeps the encoder's own pooling.
    `batch_sampler`: None (plain shuffled batches, the paper's code) or "mixed_labels" (every batch
    spans the label range; equal per-rank batch sizes under DDP).
    """

    name: ClassVar[str] = "cosent"
    data_kind: ClassVar[str] = "scored"
    settings_type: ClassVar[type[ObjectiveSettings]] = CoSENTSettings
    #: GradCache layout (training/gradcache.py): [sentence1; sentence2] features and embeddings
    row_groups: ClassVar[dict[str, int]] = {"features": 2, "labels": 1}
    embed_groups: ClassVar[int] = 2

    def __init__(self, encoder: SentenceEncoder, settings: CoSENTSettings | None = None):
        settings = settings or CoSENTSettings()
        super().__init__(encoder, settings)
        self.batch_sampler = _checked_sampler(settings.batch_sampler)
        self.scale = settings.scale
        if settings.pooling is not None:
            encoder.pooling = settings.pooling

    def collate(self, examples: list[ScoredPair]) -> dict[str, Any]:
        texts = [e.sentence1 for e in examples] + [e.sentence2 for e in examples]
        features = self.encoder.tokenize(texts)
        return {
            "features": model_inputs(features),
            "labels": torch.tensor([float(e.label) for e in examples], dtype=torch.float32),
        }

    def embed(self, batch: dict[str, Any]) -> torch.Tensor:
        return self.encoder(**batch["features"])

    def forward(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        return self.loss_from_embedded(self.embed(batch), batch)

    def loss_from_embedded(self, emb: torch.Tensor, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        n = batch["labels"].shape[0]
        cos = F.cosine_similarity(emb[:n].float(), emb[n:].float(), dim=-1)
        loss = _gathered_loss(cos, batch["labels"], self.scale)
        return {"loss": loss, "mean_cos": cos.detach().mean()}


@dataclass(frozen=True)
class CoSENTCrossEncoderSettings(ObjectiveSettings):
    """CoSENTCrossEncoder's settings (`--objective key=value`); the defaults are the paper's, see CoSENTCrossEncoder."""

    scale: float = 20.0
    dropout: float = 0.1
    batch_sampler: str | None = None


class CoSENTCrossEncoder(Objective):
    """Interaction-based CoSENT (§III-B-3, Eq. 11; Fig. 2c): the ranking loss over cross-encoder logits,

        f(i, j) = linear([CLS] of "[CLS] s_i [SEP] s_j [SEP]")     (core/cross_encoder.py)
        L = log(1 + Σ_{sim(i,j) > sim(k,l)} exp(λ (f(k,l) − f(i,j))))          (Eq. 11)

    λ = 20 as for Eq. 10 (§IV-C gives one λ for every dataset). At inference the logit itself is the
    similarity score (§III-C), so the model selected on STS-B dev and exported is the pair scorer,
    `inference_encoder()`: the export serves it at /rerank, not as embeddings. `batch_sampler` as
    for the siamese CoSENT.
    """

    name: ClassVar[str] = "cosent-cross"
    data_kind: ClassVar[str] = "scored"
    settings_type: ClassVar[type[ObjectiveSettings]] = CoSENTCrossEncoderSettings

    def __init__(self, encoder: SentenceEncoder, settings: CoSENTCrossEncoderSettings | None = None):
        settings = settings or CoSENTCrossEncoderSettings()
        super().__init__(encoder, settings)
        self.batch_sampler = _checked_sampler(settings.batch_sampler)
        self.scale = settings.scale
        self.scorer = CrossEncoder.from_encoder(encoder, settings.dropout)

    def collate(self, examples: list[ScoredPair]) -> dict[str, Any]:
        return {
            "features": self.scorer.tokenize([e.sentence1 for e in examples], [e.sentence2 for e in examples]),
            "labels": torch.tensor([float(e.label) for e in examples], dtype=torch.float32),
        }

    def forward(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        f = self.scorer(**batch["features"])
        return {"loss": _gathered_loss(f, batch["labels"], self.scale), "mean_logit": f.detach().mean()}

    def inference_encoder(self) -> CrossEncoder:  # type: ignore[override]  # a pair scorer, no embeddings
        return self.scorer


def _checked_sampler(name: str | None) -> str | None:
    """The batch sampler a CoSENT objective was asked for, if it exists (None: the plain shuffled batches)."""
    if name is not None and name not in SAMPLERS:
        raise ValueError(f"unknown batch sampler {name!r}; choose from {', '.join(SAMPLERS)} or None")
    return name
