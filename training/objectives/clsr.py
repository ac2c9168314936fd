"""CLSR (Zhang et al., "Contrastive Learning of Sentence Representations", §3–4).

SimCLR on top of a *frozen* pre-trained encoder m: a positive pair (s_a, s_b) of semantically
similar sentences (NLI entailment, or STS-B score > 4) is embedded by m with mean pooling, then by a
trainable MLP encoder e and a linear projection head h; NT-Xent over the 2m sentences of m pairs:

    v = h(e(m(s)))
    ℓ(a, b) = −log  exp(cos(v_a, v_b)/τ) / Σ_{i=1..2m} 1[i ≠ a] exp(cos(v_a, v_i)/τ)     (Eq. 1)

The denominator holds the positive and the 2m − 2 other in-batch sentences (2(n−1) negatives,
§4.4); only v_a itself is left out. Both (a, b) and (b, a) count; the loss is the mean over the 2m
terms. τ = 0.1. The downstream representation is e's output (§3, Fig. 1), so the exported model is
frozen m + mean pooling + e; h is training-only.

Because m never changes, `prepare()` embeds every training sentence once and training runs on the
cached vectors: that is what makes the paper's schedule (batch 512, 2000 epochs, lr 0.5 with decay
1e-4, 10 warm-up epochs then cosine decay; §4.1 — the preset's business, not this module's) cheap.
For the same reason a training checkpoint holds e and h only (checkpoint_state_dict).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from core.data import PairExample
from core.encoder import SentenceEncoder, model_inputs
from training.distributed import gather_with_grad, is_distributed
from training.objectives.base import Objective, ObjectiveSettings


class MLPEncoder(nn.Sequential):
    """CLSR's e: Linear(in, hidden) → ReLU → Linear(hidden, out) [→ ReLU].

    §3 says "MLP with 1 hidden layer and ReLU nonlinearity on the output"; we read the ReLU as the
    hidden layer's activation (a "2-layer MLP", §4.3). `output_relu=True` adds the literal reading,
    a ReLU on e's output as well (SimCLR's encoder output is post-ReLU).
    """

    def __init__(self, in_dim: int, hidden_dim: int, out_dim: int, output_relu: bool = False):
        layers: list[nn.Module] = [nn.Linear(in_dim, hidden_dim), nn.ReLU(), nn.Linear(hidden_dim, out_dim)]
        if output_relu:
            layers.append(nn.ReLU())
        super().__init__(*layers)
        self.out_features = out_dim  # SentenceEncoder.dim reads this


class _Chain(nn.Sequential):
    """A base model's own (frozen) head followed by e, for encoders that already had a head."""

    @property
    def out_features(self) -> int:
        return self[-1].out_features


def nt_xent(za: torch.Tensor, zb: torch.Tensor, temperature: float = 0.1) -> torch.Tensor:
    """Eq. 1 averaged over both directions of m pairs; za[i], zb[i] are the i-th positive pair.

    With several processes the candidates are every rank's 2M sentences (gather_with_grad), the
    queries this rank's 2m, and the self / positive columns are offset by rank * m.
    """
    m = za.shape[0]
    za_all, zb_all = gather_with_grad(za), gather_with_grad(zb)
    big_m = za_all.shape[0]
    offset = dist.get_rank() * m if is_distributed() else 0
    dtype = torch.float32 if za.dtype in (torch.float16, torch.bfloat16) else za.dtype
    queries = F.normalize(torch.cat([za, zb]).to(dtype), dim=-1)
    candidates = F.normalize(torch.cat([za_all, zb_all]).to(dtype), dim=-1)
    logits = queries @ candidates.T / temperature  # cos(v_a, v_i)/τ, [2m, 2M]
    local = torch.arange(m, device=za.device) + offset
    self_col = torch.cat([local, local + big_m])
    positive_col = torch.cat([local + big_m, local])
    is_self = torch.zeros_like(logits, dtype=torch.bool)
    is_self[torch.arange(2 * m, device=za.device), self_col] = True
    logits = logits.masked_fill(is_self, float("-inf"))  # 1[i ≠ a]: only v_a leaves the denominator
    return F.cross_entropy(logits, positive_col)  # −log softmax at b, mean over the 2m anchors


@dataclass(frozen=True)
class CLSRSettings(ObjectiveSettings):
    """CLSR's settings (`--objective key=value`); the defaults are the paper's, see CLSR."""

    temperature: float = 0.1
    hidden_dim: int = 768
    out_dim: int = 768
    proj_dim: int = 768
    output_relu: bool = False
    pooling: str = "mean"
    cache_batch_size: int = 256
    # Not in the paper: start e at the identity (hidden 2d, output d: W2·ReLU(W1·x) = ReLU(x) − ReLU(−x) = x),
    # so step 0 is the base model and a few hundred labelled pairs refine it instead of first undoing a
    # random MLP (issue 23's supervised recipe: a random e starts 7.8 dev nDCG@10 below the base).
    identity_init: bool = False


class CLSR(Objective):
    """Frozen transformer + mean pooling (cached) → e (MLP) → h (linear) → NT-Xent (Eq. 1).

    Sizes (§4.1): e has a 768-d output and h projects "to a latent space with the same dimensions"
    (768). The hidden width of e is not given; `hidden_dim` defaults to 768 as well. The input width
    is the base model's (384 for all-MiniLM-L6-v2). `pooling`: mean, as the paper's Table 4 picks.
    Only `anchor` and `positive` of each PairExample are used; CLSR has no hard negatives.
    Sentences that `prepare()` did not see are embedded on the fly (no grad), so collate also works
    on held-out pairs.
    """

    name: ClassVar[str] = "clsr"
    data_kind: ClassVar[str] = "pairs"
    settings_type: ClassVar[type[ObjectiveSettings]] = CLSRSettings
    batch_sampler: ClassVar[str | None] = None

    def __init__(self, encoder: SentenceEncoder, settings: CLSRSettings | None = None):
        settings = settings or CLSRSettings()
        super().__init__(encoder, settings)
        encoder.pooling = settings.pooling
        encoder.requires_grad_(False)  # m is frozen: transformer (and any head it already has)
        encoder.eval()
        self.temperature = settings.temperature
        self.cache_batch_size = settings.cache_batch_size
        if settings.identity_init:
            if settings.output_relu:
                raise ValueError("identity_init needs output_relu=False (a ReLU output is not the identity)")
            d = encoder.dim
            self.e = MLPEncoder(d, 2 * d, d)
            with torch.no_grad():
                eye = torch.eye(d)
                self.e[0].weight.copy_(torch.cat([eye, -eye]))
                self.e[2].weight.copy_(torch.cat([eye, -eye], dim=1))
                self.e[0].bias.zero_()
                self.e[2].bias.zero_()
        else:
            self.e = MLPEncoder(encoder.dim, settings.hidden_dim, settings.out_dim, settings.output_relu)
        self.h = nn.Linear(self.e.out_features, settings.proj_dim)
        # Plain attributes, not buffers: they stay on the CPU (collate indexes them in DataLoader
        # workers) and out of checkpoints.
        self._cache_index: dict[str, int] = {}
        self._cache = torch.zeros(0, encoder.dim)

    def train(self, mode: bool = True) -> CLSR:
        super().train(mode)
        self.encoder.eval()  # frozen: never dropout
        return self

    @property
    def cache_size(self) -> int:
        return len(self._cache_index)

    def prepare(self, examples: list[PairExample], device: torch.device) -> None:
        """Embed every distinct training sentence once with the frozen encoder (incremental)."""
        new = list(dict.fromkeys(s for e in examples for s in (e.anchor, e.positive) if s not in self._cache_index))
        if not new:
            return
        self.encoder.to(device)
        vecs = torch.from_numpy(self.encoder.encode(new, batch_size=self.cache_batch_size, normalize=False))
        start = self._cache.shape[0]
        self._cache = torch.cat([self._cache, vecs])
        self._cache_index.update((s, start + i) for i, s in enumerate(new))

    def collate(self, examples: list[PairExample]) -> dict[str, Any]:
        texts = [e.anchor for e in examples] + [e.positive for e in examples]
        rows = [self._cache_index.get(t) for t in texts]
        found = [i for i, r in enumerate(rows) if r is not None]
        missing = [i for i, r in enumerate(rows) if r is None]
        vectors = torch.zeros(len(texts), self._cache.shape[1])
        vectors[found] = self._cache[[rows[i] for i in found]]
        batch: dict[str, Any] = {"vectors": vectors}  # [2m, d]: anchors then positives
        if missing:
            batch["missing"] = torch.tensor(missing, dtype=torch.long)
            features = self.encoder.tokenize([texts[i] for i in missing])
            batch["missing_features"] = model_inputs(features)
        return batch

    def forward(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        x = batch["vectors"].to(self.h.weight.dtype)  # the cache is fp32; the heads may not be
        if "missing" in batch:
            with torch.no_grad():
                self.encoder.eval()  # an inference_encoder().encode() may have left it in train mode
                x = x.clone()
                x[batch["missing"]] = self.encoder(**batch["missing_features"]).to(x.dtype)
        z = self.h(self.e(x))
        m = z.shape[0] // 2
        return {"loss": nt_xent(z[:m], z[m:], self.temperature)}

    def checkpoint_state_dict(self) -> dict[str, torch.Tensor]:
        """e and h only: the frozen encoder is rebuilt from the base model on resume, and at
        bert-large size it would be ~99 % of every checkpoint written."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("encoder.")}

    def load_checkpoint_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        missing, unexpected = self.load_state_dict(state, strict=False)
        missing = [k for k in missing if not k.startswith("encoder.")]
        if missing or unexpected:
            raise RuntimeError(f"not a CLSR head checkpoint: missing {missing}, unexpected {unexpected[:5]}")

    def inference_encoder(self) -> SentenceEncoder:
        """Frozen transformer + mean pooling + e (h is dropped, §3)."""
        base = self.encoder
        head = self.e if base.head is None else _Chain(base.head, self.e)
        return SentenceEncoder(
            base.transformer,
            base.tokenizer,
            pooling=base.pooling,
            max_seq_length=base.max_seq_length,
            head=head,
            base_model=base.base_model,
        ).eval()  # encode() restores this mode: train mode would switch the shared transformer's dropout on
