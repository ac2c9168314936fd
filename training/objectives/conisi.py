"""ConIsI (Sun et al., "Contrastive Learning with Inter-Sentence Interaction for Self-Supervised
Sentence Representation", §3): SimCSE-style contrastive learning whose positive is the sentence
repeated as a sentence pair, plus a classifier that tells that pair from a pair with a
"different" sentence.

For a batch B = {x_i} (max length L) the encoder reads three inputs, sharing all weights:
    x_i                       single sentence, max length L            (encoder 1, §3.1.3)
    Y_i = [x_i; x_i]          augmented pair, max length 2L            (§3.1.1, encoder 2)
    Z_i = [x_i; c_i]          composed pair,  max length 2L            (§3.1.2, encoder 2)
Pairs are real tokenizer pairs: BERT sees [CLS] x [SEP] c [SEP] with token_type_ids 0/1, RoBERTa
<s> x </s></s> c </s>. x is first cut to L tokens, so both halves of Y are the same tokens
(Y = {t1..tl, t1..tl}, §3.1.1) and Y never needs truncating; a longer c is cut to fit 2L.

With h the pooled [CLS] state of each input (Eq. 1, 5):
    g(h) = ELU(BN(W1·h + b1))                                  (Eq. 2, the CL head)
    ℓI_i  = −log e^{sim(g(hx_i), g(hY_i))/τ} / Σ_j e^{sim(g(hx_i), g(hY_j))/τ}   (Eq. 3, τ = 0.05)
    r(h) = W3·ELU(BN(W2·h + b2)) + b3,  W2, b2, BN ≡ W1, b1, BN (Eq. 6–7: shared with g)
    ℓII_i = −log e^{r(hY_i)} / (e^{r(hY_i)} + e^{r(hZ_i)})      (Eq. 8)
    L = (1 − λ)·mean ℓI + λ·mean ℓII                            (Eq. 4, 9, 10)
So f(h) = W3·g(h) + b3: the interaction classifier is one linear layer on top of the CL head.
Inference: the [CLS] of the single-sentence input, no head (§4.2).

Readings where the paper is ambiguous (all ConIsISettings fields):
- W3 (`logit_dim`). Eq. 7 says W3 ∈ R^{d×d} and r ∈ R^d, but Eq. 8 exponentiates r as one
  number per pair ("predict whether each pair is in the same category"). Default logit_dim=1:
  W3 ∈ R^{1×d}, one logit per pair, Eq. 8 as written. logit_dim=None takes the stated shape
  W3 ∈ R^{d×d} and applies Eq. 8 to each of r's d components, averaging (d binary classifiers).
  Either way ℓII = softplus(r_Z − r_Y).
- BatchNorm batch (`batchnorm`). BN is shared by g and f; "joint" (default) normalises x, Y and Z
  rows of a batch together in one BN call (one set of statistics for the one shared layer, and
  the Y-vs-Z mean difference the classifier needs survives normalisation); "separate" normalises
  each group with its own batch statistics.
- λ (`interactive_weight`). Table 3: 0.8 for BERT-base, 0.1 for RoBERTa-base and for BERT-large.
  None picks 0.1 for RoBERTa-family encoders and for hidden size ≥ 1024, else 0.8. These are for raw
  pre-trained encoders, whose ℓI starts near ln N. On an encoder already trained contrastively
  (all-MiniLM-L6-v2, the quick preset) ℓI is near zero from the first step, ℓII (trivially separable:
  Y's halves are equal, Z's are not) has an encoder gradient hundreds of times ℓI's at step 0, and
  λ = 0.8 lost dev nDCG@10 on the training guide's domain recipe; the quick preset sets λ = 0.003, which
  balances the two gradients (RESULTS.md, issue 23). λ = 0 drops ℓII and never encodes Z.
- Positive (`positive`, an ablation switch, not in the paper): "pair" (default) is Y = [x; x] as
  above; "dropout" is x encoded a second time (SimCSE's positive), with Y and Z still feeding ℓII.
- Head (`head`, an ablation switch, not in the paper): "bn_elu" (default) is g of Eq. 2 above;
  "tanh" is SimCSE's head g(h) = tanh(W1·h + b1) (no BatchNorm, so `batchnorm` changes nothing),
  with the classifier f(h) = W3·g(h) + b3 on it as before.
- Strategy for c (`strategy`, §3.2): "o1" sub-word replacement, "o2" WordNet antonyms, "s" another
  sentence of the batch. Default "s": the paper's final model (§4.7.1) and its best with BERT
  (Table 6; with RoBERTa o1 scored higher). A batch of one sentence has no other sentence, so "s"
  falls back to "o1" for it.
- o1's proportion is not given in the paper; `subword_proportion` = 0.15, BERT's MLM rate, whose
  80%/20% rule ConIsI uses. o2's rate is not given either: `antonym_probability` (0.5) per
  antonym-bearing word, at least one per sentence (`antonym_at_least_one`). o2 takes each word's
  antonym in the part of speech the word has in its sentence (a rule over WordNet's lexicon,
  training/augment/pos.py): antonymy in WordNet only links words of one part of speech.
- c ≠ x (`ensure_different`, default on): c is meant to be "not in the same semantic category" as
  x, and a pair with c == x is the positive Y labelled negative. o1 then replaces at least one
  sub-word for real, and any c that still equals x token for token (o2 with no antonym in the
  sentence, s drawing a duplicate sentence) gets o1 instead: like o2 it keeps c textually close to x.
  Collating corpus/wordnet-sentences.txt and counting Z rows equal to Y rows: without it a large
  share of o1 and o2 rows had c == x; with it, none for o1, o2, s (the counts: commit 5c4720d).
- Pooling: [CLS] (`pooling`="cls"); a preset may override it (the encoder's pooling is then used
  for h everywhere, training and inference alike).
- Multi-GPU: the contrastive negatives g(hY_j) are gathered from all ranks (with their gradient).
  `sync_batchnorm` (default True) gives BN the global batch's statistics, so R GPUs compute the
  gradient one GPU would on the global batch; False keeps per-rank statistics (the SimCSE-style
  code path without SyncBN). The "s" partner is drawn within a rank's batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from core.encoder import SentenceEncoder, model_inputs
from training.augment.construct import (
    ANTONYM_PROBABILITY,
    SUBWORD_PROPORTION,
    SUBWORD_RANDOM_SHARE,
    antonym_replace,
    other_indices,
    subword_replace,
)
from training.augment.wordnet import DEFAULT_WORDNET_DIR, Antonyms
from training.distributed import gather_with_grad, is_distributed, local_slice
from training.objectives.base import Objective, ObjectiveSettings
from training.objectives.losses import info_nce

STRATEGIES = ("o1", "o2", "s")
POSITIVES = ("pair", "dropout")
HEADS = ("bn_elu", "tanh")
BATCHNORM_MODES = ("joint", "separate")
ROBERTA_TYPES = ("roberta", "xlm-roberta", "camembert")


def default_interactive_weight(config) -> float:
    """λ from Table 3: 0.8 for BERT-base, 0.1 for RoBERTa-base and BERT-large."""
    if config.model_type in ROBERTA_TYPES or getattr(config, "hidden_size", 0) >= 1024:
        return 0.1
    return 0.8


@dataclass(frozen=True)
class ConIsISettings(ObjectiveSettings):
    """ConIsI's settings (`--objective key=value`); the defaults are the paper's, see ConIsI."""

    strategy: str = "s"
    positive: str = "pair"
    head: str = "bn_elu"
    interactive_weight: float | None = None
    temperature: float = 0.05
    pooling: str | None = "cls"
    max_length: int | None = 32
    subword_proportion: float = SUBWORD_PROPORTION
    subword_random_share: float = SUBWORD_RANDOM_SHARE
    antonym_probability: float = ANTONYM_PROBABILITY
    antonym_at_least_one: bool = True
    ensure_different: bool = True
    wordnet_dir: str | Path = DEFAULT_WORDNET_DIR
    batchnorm: str = "joint"
    logit_dim: int | None = 1
    sync_batchnorm: bool = True


class ConIsI(Objective):
    name: ClassVar[str] = "conisi"
    data_kind: ClassVar[str] = "unlabeled"
    settings_type: ClassVar[type[ObjectiveSettings]] = ConIsISettings

    def __init__(self, encoder: SentenceEncoder, settings: ConIsISettings | None = None):
        settings = settings or ConIsISettings()
        super().__init__(encoder, settings)
        if settings.strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {settings.strategy!r}; choose from {STRATEGIES}")
        if settings.positive not in POSITIVES:
            raise ValueError(f"unknown positive {settings.positive!r}; choose from {POSITIVES}")
        if settings.head not in HEADS:
            raise ValueError(f"unknown head {settings.head!r}; choose from {HEADS}")
        if settings.batchnorm not in BATCHNORM_MODES:
            raise ValueError(f"unknown batchnorm {settings.batchnorm!r}; choose from {BATCHNORM_MODES}")
        if settings.pooling is not None:
            encoder.pooling = settings.pooling
        config = encoder.transformer.config
        self.strategy = settings.strategy
        self.positive = settings.positive
        self.interactive_weight = (
            default_interactive_weight(config) if settings.interactive_weight is None
            else float(settings.interactive_weight)
        )
        self.temperature = settings.temperature
        self.max_length = min(settings.max_length or encoder.max_seq_length, encoder.max_seq_length)
        limit = getattr(config, "max_position_embeddings", 512) - (2 if config.model_type in ROBERTA_TYPES else 0)
        self.pair_max_length = min(2 * self.max_length, limit)  # "set double" (§3.1.3)
        self.subword_proportion = settings.subword_proportion
        self.subword_random_share = settings.subword_random_share
        self.antonym_probability = settings.antonym_probability
        self.antonym_at_least_one = settings.antonym_at_least_one
        self.ensure_different = settings.ensure_different
        self.antonyms = Antonyms(settings.wordnet_dir)
        if settings.strategy == "o2":
            self.antonyms.check()  # fail now, with the apt package named, not in a DataLoader worker
        special = set(encoder.tokenizer.all_special_ids)
        # a plain CPU tensor, not a buffer: collate runs on CPU (in DataLoader workers)
        self.vocab_ids = torch.tensor([i for i in range(len(encoder.tokenizer)) if i not in special])
        self.batchnorm = settings.batchnorm
        self.sync_batchnorm = settings.sync_batchnorm
        d = encoder.dim
        # g (Eq. 2) = the W2/b2/BN/ELU part of f (Eq. 6): one module serves both; head="tanh": SimCSE's
        self.head = (nn.Sequential(nn.Linear(d, d), nn.BatchNorm1d(d), nn.ELU()) if settings.head == "bn_elu"
                     else nn.Sequential(nn.Linear(d, d), nn.Tanh()))
        self.classifier = nn.Linear(d, d if settings.logit_dim is None else settings.logit_dim)  # W3, b3 (Eq. 7)

    def prepare(self, examples: list, device: torch.device) -> None:
        if self.strategy == "o2":
            _ = self.antonyms.table, self.antonyms.lexicon  # built once here: forked DataLoader workers inherit them

    # ---- batch construction (CPU, DataLoader workers) ----
    def collate(self, examples: list[str], generator: torch.Generator | None = None) -> dict[str, Any]:
        tok = self.encoder.tokenizer
        texts = list(examples)
        single = tok(
            texts,
            padding=True,
            truncation=True,
            max_length=self.max_length,
            return_offsets_mapping=True,
            return_tensors="pt",
        )
        # x cut to its first L tokens, as text: the pair halves then tokenise to the same ids
        cut = []
        for i, text in enumerate(texts):
            ends = [int(single["offset_mapping"][i, j, 1]) for j, s in enumerate(single.sequence_ids(i)) if s == 0]
            cut.append(text[: ends[-1]] if ends else "")
        strategy = "o1" if self.strategy == "s" and len(texts) < 2 else self.strategy
        if strategy == "s":
            partner = other_indices(len(cut), generator)
            composed = [cut[k] for k in partner.tolist()]
        elif strategy == "o2":
            composed = [
                antonym_replace(
                    x, self.antonyms.in_context, self.antonym_probability, self.antonym_at_least_one, generator
                )
                for x in cut
            ]
        else:
            composed = cut  # corrupted at the token level below
        pairs = tok(
            cut + cut,
            cut + composed,
            padding=True,
            truncation=True,
            max_length=self.pair_max_length,
            return_tensors="pt",
        )
        n = len(cut)
        ids = pairs["input_ids"]
        # o1 corrupts every c; the others fall back to it where c came out equal to x
        rows = torch.ones(n, dtype=torch.bool) if strategy == "o1" else (ids[:n] == ids[n:]).all(1)
        if strategy == "o1" or (self.ensure_different and rows.any()):
            c_tokens = torch.tensor([[s == 1 for s in pairs.sequence_ids(i)] for i in range(n, 2 * n)])
            new, _, _ = subword_replace(
                ids[n:],
                c_tokens & rows.unsqueeze(1),  # only Z's second sentence is c; Y stays [x; x]
                self.vocab_ids,
                self.subword_proportion,
                self.subword_random_share,
                generator,
                at_least_one=self.ensure_different,
            )
            pairs["input_ids"] = torch.cat([ids[:n], new])
        return {"single": model_inputs(single), "pairs": model_inputs(pairs)}

    # ---- losses ----
    def project(self, h_x: torch.Tensor, h_y: torch.Tensor, h_z: torch.Tensor) -> list[torch.Tensor]:
        """g(h) = ELU(BN(W1·h + b1)) for the three groups (Eq. 2 / Eq. 6); tanh(W1·h + b1) with head="tanh"."""
        # with sync_batchnorm on several GPUs: the head over every rank's rows (autograd gather), then this rank's
        return self._project_groups(h_x, h_y, h_z)

    def _project_local(self, *groups: torch.Tensor) -> list[torch.Tensor]:
        if self.batchnorm == "joint":
            return list(self.head(torch.cat(groups)).split([len(h) for h in groups]))
        return [self.head(h) if len(h) else h.new_zeros(0, self.head[0].out_features) for h in groups]

    def _project_groups(self, *groups: torch.Tensor) -> list[torch.Tensor]:
        """`project` for any number of groups (positive="dropout" has four: x, x⁺, Y, Z)."""
        if self.sync_batchnorm and self.training and is_distributed():
            whole = self._project_local(*(gather_with_grad(h) for h in groups))
            return [local_slice(g, len(h)) for g, h in zip(whole, groups)]
        return self._project_local(*groups)

    def terms(self, h_x: torch.Tensor, h_y: torch.Tensor, h_z: torch.Tensor,
              positive: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(ℓI mean (Eq. 3–4), ℓII mean (Eq. 8–9) or None when λ = 0, r_Y − r_Z or None), with their graphs.

        `positive`: the contrastive key of x_i instead of Y_i (positive="dropout": x again); Y and Z
        still feed the classifier.
        """
        if positive is None:
            g_x, g_y, g_z = self.project(h_x, h_y, h_z)
            g_key = g_y
        else:
            g_x, g_key, g_y, g_z = self._project_groups(h_x, positive, h_y, h_z)
        contrastive = info_nce(g_x, g_key, self.temperature)  # Eq. 3–4
        if not self.interactive_weight:
            return contrastive, None, None
        margin = (self.classifier(g_y).float() - self.classifier(g_z).float())  # r_Y − r_Z (Eq. 7)
        return contrastive, F.softplus(-margin).mean(), margin  # Eq. 8–9: −log e^rY/(e^rY + e^rZ)

    def losses(self, h_x: torch.Tensor, h_y: torch.Tensor, h_z: torch.Tensor,
               positive: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Eq. 2–10 from the pooled states of x, Y and Z ([N, d] each; Z empty when λ = 0)."""
        contrastive, interactive, margin = self.terms(h_x, h_y, h_z, positive)
        if interactive is None:
            return {"loss": contrastive, "loss_contrastive": contrastive.detach()}
        lam = self.interactive_weight
        return {
            "loss": (1 - lam) * contrastive + lam * interactive,  # Eq. 10
            "loss_contrastive": contrastive.detach(),
            "loss_interactive": interactive.detach(),
            "interactive_acc": (margin > 0).float().mean().detach(),
            "interactive_margin": margin.mean().detach(),
        }

    def forward(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        single = batch["single"]
        if self.positive == "dropout":  # x twice in one pass: two dropout masks (SimCSE's positive)
            single = {k: torch.cat([v, v]) for k, v in single.items()}
        h_single = self.encoder(**single)  # encoder 1
        if not self.interactive_weight and self.positive == "dropout":  # no pair plays any part
            h_y = h_z = h_single[:0]
        elif not self.interactive_weight:  # λ = 0: no classifier, so Z is never encoded
            h_y = self.encoder(**{k: v[: len(v) // 2] for k, v in batch["pairs"].items()})
            h_z = h_y[:0]
        else:
            h_y, h_z = self.encoder(**batch["pairs"]).chunk(2)  # encoder 2 (same weights)
        if self.positive == "dropout":
            h_x, h_plus = h_single.chunk(2)
            return self.losses(h_x, h_y, h_z, positive=h_plus)
        return self.losses(h_single, h_y, h_z)

    def inference_encoder(self) -> SentenceEncoder:
        return self.encoder  # [CLS] of the single sentence, no CL head or classifier (§4.2)
