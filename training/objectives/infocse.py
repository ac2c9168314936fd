"""InfoCSE (Wu et al., 2022, "InfoCSE: Information-aggregated Contrastive Learning of Sentence
Embeddings", §3): SimCSE plus an auxiliary MLM network that must reconstruct masked tokens from the
sentence embedding, so the [CLS] vector has to aggregate the sentence's information.

Notation (§2): H = last-layer states, h = the [CLS] vector of H (12-cls), M>0 = the tap layer's
(6th of 12) states without [CLS] (6-hiddens). The auxiliary network = the encoder's embeddings and
lower `tap_layer` layers + `num_extra_layers` (2) extra transformer layers fed C = [h ; M>0].

Stage 1, `stages()` (§3.1, a Stage the training loop runs before its own): the auxiliary network
*shares* the lower layers with the encoder; one masked input x̂ feeds both MLM losses, which share
the output head (W and its transform):
    L_mlm = CE(head(H(x̂)), x)                                   Eq. 4 (BERT's MLM on the top layer)
    L_aux = CE(head(Extra([h(x̂) ; M>0(x̂)])), x)                 Eq. 5
    L_pretrain = L_aux + λ_mlm·L_mlm                             Eq. 6 (λ_mlm = 1.0, §4.2)
Stage 2, `forward()` (§3.2): the auxiliary network gets its own copy of the lower layers, frozen;
the encoder keeps training. Each sentence x is used three times: twice (two dropout masks) for
SimCSE's contrastive loss, once masked (x̂) for the auxiliary MLM:
    L_cl  = −log e^{sim(g(h), g(h⁺))/τ} / Σ_j e^{sim(g(h), g(h_j⁺))/τ}   Eq. 3 (g: MLP, training only)
    C     = [h ; Detach(M>0(x̂))]      (h: the first contrastive view's sentence vector, with grad)
    L_joint = L_cl + λ·L_aux(C)                                  Eq. 7
L_aux's gradient reaches the encoder only through h. Inference: the encoder's [CLS], no auxiliary
network, no MLP (§4.1, "cls_before_pooler", Table 9).

Defaults are the paper's: τ = 0.05; λ = 1e-5 and mask rate 0.4 in stage 2 (the best values of the
ablations, Tables 7 and 8, and the official script's mlm_weight / mlm_probability; §4.2's text says
λ = 0.005, which Table 8 scores 80.48 vs 85.49 for 1e-5 — we follow the table); stage 1 (§4.2):
lr 1e-4, global batch 1024, 8 epochs (stage1_steps caps it), λ_mlm 1.0, mask rate 0.15 (BERT's,
§2). Not stated, taken from Condenser's HF-Trainer recipe that §4.2 follows: AdamW, weight decay
0.01, 10 % linear warm-up then linear decay, gradient clipping 1.0.

Choices where the paper is silent (each an InfoCSESettings field):
- tap_layer: the paper taps layer 6 of 12; other depths tap num_layers // 2 (3 for MiniLM-L6).
- extra_layers_init "random": Condenser initialises its head layers afresh; "top" copies the
  encoder's top layers (what Table 4's "w/o pre-training" ablation uses, with stage1_steps=0).
- Starting from a Condenser checkpoint (`aux_from`, default: where the encoder was loaded from;
  named explicitly, it must hold one and a hub name's model.pt is downloaded):
  Condenser's pre-training *is* stage 1 (Eq. 4–6), and the official stage-2 script starts from
  Luyu/condenser. When that directory holds Condenser's `model.pt`, its "c_head.*" layers become the
  extra layers (replacing extra_layers_init) and its "cls.predictions.*" the MLM head; stage 1 then
  continues from them for stage1_steps (0 skips it, as the official recipe does). tap_layer must be
  Condenser's --skip_from (6 for Luyu/condenser, the default num_layers // 2 of BERT-base).
- The MLM head: loaded from the base checkpoint's "cls.predictions.*" (or RoBERTa "lm_head.*")
  weights when its directory has them (`mlm_head_from`, default: where the encoder was loaded
  from); otherwise a fresh BertOnlyMLMHead-like head (BERT init) whose W is tied to the word
  embeddings — all-MiniLM-L6-v2 ships without one, so stage 1 also trains the head from scratch.
  In stage 1, W is the encoder's word-embedding matrix (BERT's tying; the lower layers are shared
  anyway). In stage 2 the head gets its own trainable copy of W, so L_aux cannot reach the
  encoder's embeddings through the decoder (the official code keeps a separate lm_head too).
- Stage 1 trains the whole encoder (BERT's own MLM loss updates all its layers); stage 2 starts
  from those weights, and the frozen lower copy is taken from them ("both initialized with the
  parameters from the first stage", §3.2). stage1_train_encoder=False (not in the paper) trains
  only the extra layers and the head's transform and bias, for a base model that is already a
  sentence encoder: with all-MiniLM-L6-v2 and a fresh head, 25 full stage-1 steps (batch 64,
  lr 1e-4) took its STS-B dev Spearman from 86.7 to 84.0 before stage 2 began.
- Losses are means over masked tokens (Eq. 4–5 write sums; BERT/HF code averages).
- h under a pooling other than "cls" (a preset may choose "mean") is the pooled vector: the
  auxiliary network reconstructs from whatever vector is the sentence embedding.
- Masking is BERT's 80/10/10 (transformers' DataCollatorForLanguageModeling) at the stage's rate;
  special tokens and padding are never masked; labels are −100 elsewhere.
- projection "mlp" is SimCSE's Linear+Tanh (§3.2: "same as SimCSE"). The official script passes
  --batchnorm; projection="bn_mlp" is its ProjectionMLP (infocse/models_cls_mlm.py):
  Linear(d, 2d) → BN → ReLU → Linear(2d, d) → BN without affine, Linears without bias. Both views
  go through it as one batch (the official code flattens [B, 2, d] first), so BN's statistics are
  those of all 2B rows.
- The frozen lower copy runs under no_grad (its states carry no graph) and, with
  `aux_lower_dropout` (default), follows the objective's train/eval mode. The official script
  passes --mlm_eval, which keeps it in eval mode (no dropout): aux_lower_dropout=False.
- Official stage-2 recipe (infocse-bert-base.sh; the paper's §4.2 text says lr 3e-5, one epoch):
  start from Luyu/condenser, lr 7e-6, 2 epochs, batch 64, fp16, bn_mlp, --mlm_eval, λ 1e-5, mask
  rate 0.4, evaluation every 125 steps: training/config.py's preset "paper-official".
Stage 1 goes through the same loop as stage 2 (training/loop.py), with its own batches (a stream of
global batches of stage1_batch_size, seeded by stage1_seed, each rank taking its slice), optimiser and
schedule (above), and stage1_micro_batch_size's micro-batches. A stage-2 state_dict holds the frozen
lower copy (`aux_lower.*`): loading one builds stage 2's structure, so the stages() that follow a
resume find stage 1 done and declare none.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DataCollatorForLanguageModeling

from core.encoder import SentenceEncoder, model_inputs
from core.pooling import pool
from training.distributed import global_share, rank, world_size
from training.objectives.base import Objective, ObjectiveSettings, Stage
from training.objectives.infocse_aux import (
    CONDENSER_FILE,
    ExtraLayers,
    MLMHead,
    find_condenser_head_state,
    find_mlm_head_state,
    frozen_lower_copy,
)
from training.objectives.losses import info_nce
from training.optim import build_scheduler


class ProjectionMLP(nn.Sequential):
    """The official InfoCSE code's --batchnorm projector (its ProjectionMLP, DiffCSE's too):
    Linear(d, 2d, no bias) → BatchNorm1d(2d) → ReLU → Linear(2d, d, no bias) → BatchNorm1d(d, no affine)."""

    def __init__(self, d: int):
        super().__init__(
            nn.Linear(d, 2 * d, bias=False),
            nn.BatchNorm1d(2 * d),
            nn.ReLU(inplace=True),
            nn.Linear(2 * d, d, bias=False),
            nn.BatchNorm1d(d, affine=False),
        )


@dataclass(frozen=True)
class InfoCSESettings(ObjectiveSettings):
    """InfoCSE's settings (`--objective key=value`); the defaults are the paper's, see InfoCSE."""

    temperature: float = 0.05
    aux_weight: float = 1e-5
    mask_rate: float = 0.4
    pooling: str | None = "cls"
    max_length: int | None = 32
    tap_layer: int | None = None
    num_extra_layers: int = 2
    extra_layers_init: str = "random"
    projection: str = "mlp"
    mlm_head_from: str | None = None
    aux_from: str | None = None
    aux_lower_dropout: bool = True
    stage1_steps: int | None = None
    stage1_epochs: float = 8.0
    stage1_batch_size: int = 1024
    stage1_micro_batch_size: int | None = None
    stage1_lr: float = 1e-4
    stage1_weight_decay: float = 0.01
    stage1_warmup_ratio: float = 0.1
    stage1_max_grad_norm: float | None = 1.0
    stage1_mask_rate: float = 0.15
    stage1_mlm_weight: float = 1.0
    stage1_seed: int = 0
    stage1_amp: bool = True
    stage1_train_encoder: bool = True


class InfoCSE(Objective):
    """Stage 1 from stages() (L_aux + λ_mlm·L_mlm), stage 2 in forward() (L_cl + λ·L_aux).

    forward's batch (from collate): "features" = [x; x] tokenised (2B rows), "mlm" = x̂ (B rows:
    input_ids masked, attention_mask, token_type_ids, labels). Returns loss, loss_cl, loss_aux,
    pos_cos.
    """

    name: ClassVar[str] = "infocse"
    data_kind: ClassVar[str] = "unlabeled"
    settings_type: ClassVar[type[ObjectiveSettings]] = InfoCSESettings
    settings: InfoCSESettings

    def __init__(self, encoder: SentenceEncoder, settings: InfoCSESettings | None = None):
        settings = settings or InfoCSESettings()
        super().__init__(encoder, settings)
        transformer = encoder.transformer
        if not hasattr(getattr(transformer, "encoder", None), "layer"):
            raise ValueError("InfoCSE needs a BERT/RoBERTa-style transformer (transformer.encoder.layer)")
        if encoder.tokenizer.mask_token is None:
            raise ValueError("InfoCSE's MLM needs a tokenizer with a mask token")
        num_layers = len(transformer.encoder.layer)
        self.tap_layer = num_layers // 2 if settings.tap_layer is None else settings.tap_layer
        if not 1 <= self.tap_layer <= num_layers:
            raise ValueError(f"tap_layer must be in 1..{num_layers}, got {self.tap_layer}")
        if settings.projection not in ("mlp", "bn_mlp"):
            raise ValueError(f"projection must be 'mlp' or 'bn_mlp', not {settings.projection!r}")
        if settings.pooling is not None:
            encoder.pooling = settings.pooling
        self.temperature = settings.temperature
        self.aux_weight = settings.aux_weight
        self.mask_rate = settings.mask_rate
        self.max_length = min(settings.max_length or encoder.max_seq_length, encoder.max_seq_length)

        d = encoder.dim
        self.mlp = nn.Sequential(nn.Linear(d, d), nn.Tanh()) if settings.projection == "mlp" else ProjectionMLP(d)
        self.extra_layers = ExtraLayers(transformer, settings.num_extra_layers, settings.extra_layers_init)
        self.mlm_head = MLMHead(transformer.config, transformer.get_input_embeddings())
        source = settings.mlm_head_from or getattr(transformer, "name_or_path", None) or encoder.base_model
        state = find_mlm_head_state(source)
        if state is not None:
            self.mlm_head.load_state_dict(state, strict=False)  # W stays tied to the embeddings
        self.mlm_head_source = str(source) if state is not None else "fresh"
        condenser_source = settings.aux_from or source
        condenser = find_condenser_head_state(condenser_source, download=settings.aux_from is not None)
        # aux_from named on purpose: random layers would be a silent miss
        if condenser is None and settings.aux_from is not None:
            raise FileNotFoundError(f"no Condenser head ({CONDENSER_FILE} with c_head.* tensors) in "
                                    f"{settings.aux_from}")
        if condenser is not None:
            self.extra_layers.load_condenser(condenser)
        self.aux_source = str(condenser_source) if condenser is not None else settings.extra_layers_init
        self.aux_lower_dropout = settings.aux_lower_dropout
        self.aux_lower: nn.Module | None = None  # stage 2's frozen lower layers, built by prepare()

        tok = encoder.tokenizer
        self._special_ids = torch.tensor(sorted(set(tok.all_special_ids)), dtype=torch.long)
        self._masker = DataCollatorForLanguageModeling(tok, mlm_probability=settings.mask_rate, return_tensors="pt")
        self._stage1_masker = DataCollatorForLanguageModeling(
            tok, mlm_probability=settings.stage1_mask_rate, return_tensors="pt"
        )

    # ---------------------------------------------------------------------------------------------
    # Batches

    def mask(self, features, masker: DataCollatorForLanguageModeling | None = None) -> dict[str, torch.Tensor]:
        """x̂: BERT masking (80 % [MASK], 10 % random token, 10 % kept) of the non-special, non-padding
        tokens; labels are the original ids there and −100 elsewhere."""
        masker = masker or self._masker
        ids = features["input_ids"]
        never = ~features["attention_mask"].bool() | torch.isin(ids, self._special_ids)
        masked, labels = masker.torch_mask_tokens(ids.clone(), special_tokens_mask=never)
        out = {k: v for k, v in model_inputs(features).items() if k != "input_ids"}
        return {"input_ids": masked, **out, "labels": labels}

    def collate(self, examples: list[str]) -> dict[str, Any]:
        texts = list(examples)
        features = model_inputs(self.encoder.tokenize(texts * 2, max_length=self.max_length))
        first = {k: v[: len(texts)] for k, v in features.items()}
        return {"features": features, "mlm": self.mask(first)}

    def collate_stage1(self, examples: list[str]) -> dict[str, torch.Tensor]:
        features = model_inputs(self.encoder.tokenize(list(examples), max_length=self.max_length))
        return self.mask(features, self._stage1_masker)

    # ---------------------------------------------------------------------------------------------
    # Pieces of the losses

    def sentence_vector(self, out, attention_mask: torch.Tensor) -> torch.Tensor:
        """h: the encoder's pooled vector before any head (the [CLS] of H under pooling "cls")."""
        return pool(self.encoder.pooling, out.last_hidden_state, attention_mask, out.hidden_states,
                    self.encoder.layer_weights)

    @staticmethod
    def aux_input(h: torch.Tensor, token_states: torch.Tensor) -> torch.Tensor:
        """C = [h ; M>0]: h [B, H] takes the [CLS] slot, the tap layer's states [B, T, H] the rest."""
        return torch.cat([h.unsqueeze(1).to(token_states.dtype), token_states[:, 1:]], dim=1)

    def aux_loss(self, h, token_states, attention_mask, labels) -> torch.Tensor:
        """L_aux (Eq. 5): the extra layers over C, the shared head, CE at the masked positions."""
        hidden = self.extra_layers(self.aux_input(h, token_states), attention_mask)
        return self.mlm_head.loss(hidden, labels)

    def loss_from_embeddings(self, z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        """L_cl (Eq. 3): InfoNCE over the MLP of the two dropout views, in-batch negatives. The views
        pass the MLP as one batch: the same thing for Linear+Tanh, one set of BN statistics for bn_mlp."""
        g1, g2 = self.mlp(torch.cat([z1, z2])).chunk(2)
        return info_nce(g1, g2, self.temperature)

    def stage1_inputs(self, mlm: dict[str, torch.Tensor]):
        """Stage 1's shared pass over x̂: (H, h, M) with M the tap layer's states (with grad)."""
        inputs = {k: v for k, v in mlm.items() if k != "labels"}
        out = self.encoder.transformer_outputs(**inputs, output_hidden_states=True)
        # hidden_states[0] is the embedding output, so [k] is the k-th layer's output
        return (
            out.last_hidden_state,
            self.sentence_vector(out, mlm["attention_mask"]),
            out.hidden_states[self.tap_layer],
        )

    def stage1_losses(self, mlm: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Eq. 4–6 on one masked batch: {"loss", "loss_aux", "loss_mlm"}."""
        top, h, tapped = self.stage1_inputs(mlm)
        loss_mlm = self.mlm_head.loss(top, mlm["labels"])
        loss_aux = self.aux_loss(h, tapped, mlm["attention_mask"], mlm["labels"])
        return {"loss": loss_aux + self.settings.stage1_mlm_weight * loss_mlm, "loss_aux": loss_aux,
                "loss_mlm": loss_mlm}

    def tapped_states(self, mlm: dict[str, torch.Tensor]) -> torch.Tensor:
        """Stage 2's Detach(M): the frozen lower copy's last states on x̂, computed without a graph."""
        if self.aux_lower is None:
            raise RuntimeError("InfoCSE's stages() have not run: the auxiliary lower layers do not exist yet")
        inputs = {k: v for k, v in mlm.items() if k != "labels"}
        with torch.no_grad():
            return self.aux_lower(**inputs, return_dict=True).last_hidden_state.detach()

    # ---------------------------------------------------------------------------------------------
    # Stage 2: the ordinary training step

    def forward(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        features, mlm = batch["features"], batch["mlm"]
        enc = self.encoder
        out = enc.transformer_outputs(**features, output_hidden_states=enc.needs_hidden_states)
        pooled = self.sentence_vector(out, features["attention_mask"])
        emb = enc.head(pooled) if enc.head is not None else pooled
        z1, z2 = emb.chunk(2)
        loss_cl = self.loss_from_embeddings(z1, z2)
        h = pooled[: z1.shape[0]]  # the first view's sentence vector; L_aux reaches the encoder only here
        loss_aux = self.aux_loss(h, self.tapped_states(mlm), mlm["attention_mask"], mlm["labels"])
        # a mean over this rank's masked tokens, whose count varies by rank: weight it to its share
        # of the global batch's token mean
        aux_share = global_share(int((mlm["labels"] != -100).sum()), loss_aux.device)
        with torch.no_grad():
            pos_cos = F.cosine_similarity(z1.float(), z2.float(), dim=-1).mean()
        return {
            "loss": loss_cl + self.aux_weight * aux_share * loss_aux,
            "loss_cl": loss_cl.detach(),
            "loss_aux": loss_aux.detach(),
            "pos_cos": pos_cos,
        }

    def inference_encoder(self) -> SentenceEncoder:
        return self.encoder

    # ---------------------------------------------------------------------------------------------
    # Stage 1: pre-training the auxiliary network, then the split for stage 2

    def stages(self, examples: list[str], device: torch.device) -> Iterator[Stage]:
        """Stage 1 on `examples` (none with stage1_steps=0), then the split for stage 2: the auxiliary
        network's frozen lower copy and its own W. None at all once in stage 2 (a resumed stage-2 state)."""
        if self.aux_lower is not None:
            return
        frozen = [] if self.settings.stage1_train_encoder else [p for p in self.encoder.parameters()
                                                                 if p.requires_grad]
        for p in frozen:
            p.requires_grad_(False)
        try:
            stage = self._stage1(list(examples), torch.device(device))
            if stage is not None:
                yield stage
        finally:
            for p in frozen:
                p.requires_grad_(True)
        self._enter_stage2()

    def _enter_stage2(self) -> None:
        """The split after stage 1: the frozen lower copy, and W untied from the encoder's embeddings."""
        self.aux_lower = frozen_lower_copy(self.encoder.transformer, self.tap_layer).to(self.encoder.device)
        self.train(self.training)  # puts the new copy in the mode it should have
        self.mlm_head.untie()

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        # A checkpoint taken in stage 2 (a resume): give this module stage 2's shape before loading.
        if self.aux_lower is None and any(k.startswith("aux_lower.") for k in state_dict):
            self._enter_stage2()
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def train(self, mode: bool = True) -> InfoCSE:
        super().train(mode)
        if self.aux_lower is not None and not self.aux_lower_dropout:
            self.aux_lower.eval()  # the official --mlm_eval
        return self

    def _stage1(self, examples: list[str], device: torch.device) -> Stage | None:
        s = self.settings
        world = world_size()
        global_batch = max(world, min(s.stage1_batch_size, len(examples)))
        local_batch = global_batch // world
        steps = s.stage1_steps
        if steps is None:
            steps = math.ceil(s.stage1_epochs * math.ceil(len(examples) / global_batch))
        if steps <= 0 or not examples:
            return None
        micro = s.stage1_micro_batch_size or local_batch
        chunks = math.ceil(local_batch / micro)
        # the encoder, the extra layers and the head (W is the embedding matrix: counted once); not the MLP
        params = list(
            {
                id(p): p
                for m in (self.encoder, self.extra_layers, self.mlm_head)
                for p in m.parameters()
                if p.requires_grad
            }.values()
        )
        optimizer = torch.optim.AdamW(params, lr=s.stage1_lr, weight_decay=s.stage1_weight_decay)

        def loss(mlm: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            out = self.stage1_losses(mlm)
            # the loop averages a step's micro-batches: a short last one counts by its rows
            return {**out, "loss": out["loss"] * (len(mlm["labels"]) * chunks / local_batch)}

        bf16 = s.stage1_amp and device.type == "cuda" and torch.cuda.is_bf16_supported()
        return Stage(
            "infocse stage 1 (aux pre-training)", self._stage1_batches(examples, global_batch, local_batch, micro),
            steps, optimizer, build_scheduler(optimizer, "linear", int(s.stage1_warmup_ratio * steps), steps),
            loss=loss, micro_batches=chunks, max_grad_norm=s.stage1_max_grad_norm, params=params,
            autocast=torch.bfloat16 if bf16 else None)

    def _stage1_batches(self, examples: list[str], global_batch: int, local_batch: int,
                        micro: int) -> Iterator[dict[str, torch.Tensor]]:
        """Endless: each step's global batch from the index stream (the same on every rank), this rank's slice
        of it in micro-batches of `micro`, masked."""
        order = _index_stream(len(examples), torch.Generator().manual_seed(self.settings.stage1_seed))
        this = rank()
        while True:
            idx = [next(order) for _ in range(global_batch)][this * local_batch : (this + 1) * local_batch]
            texts = [examples[i] for i in idx]
            for start in range(0, len(texts), micro):
                yield self.collate_stage1(texts[start : start + micro])


def _index_stream(n: int, generator: torch.Generator):
    """Example indices epoch after epoch, each epoch a fresh permutation (identical on every rank)."""
    while True:
        yield from torch.randperm(n, generator=generator).tolist()
