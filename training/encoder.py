"""The trainable sentence encoder: a Hugging Face transformer, a pooling rule and an optional head.

This is the one torch model every objective trains and the exporter turns into ONNX. Objectives
that need more (projection heads, auxiliary networks) own those modules themselves; only what the
served embedding depends on lives here.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from torch import nn
from transformers import AutoConfig, AutoModel, AutoTokenizer

POOLINGS = ("mean", "cls", "first_last_avg")
DEFAULT_MAX_SEQ_LENGTH = 256


def read_st_config(model_dir: str | Path) -> tuple[str | None, int | None]:
    """Pooling mode and max sequence length from a sentence-transformers directory, if present."""
    model_dir = Path(model_dir)
    pooling = None
    pooling_file = model_dir / "1_Pooling" / "config.json"
    if pooling_file.is_file():
        cfg = json.loads(pooling_file.read_text())
        if cfg.get("pooling_mode_first_last_avg"):
            pooling = "first_last_avg"
        elif cfg.get("pooling_mode_cls_token"):
            pooling = "cls"
        elif cfg.get("pooling_mode_mean_tokens"):
            pooling = "mean"
        # max / mean_sqrt_len pooling are not supported: fail rather than serve a different model
        elif any(cfg.get(k) for k in ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens")):
            raise ValueError(f"unsupported pooling in {pooling_file}: only mean, cls, first_last_avg")
    max_len = None
    st_file = model_dir / "sentence_bert_config.json"
    if st_file.is_file():
        max_len = json.loads(st_file.read_text()).get("max_seq_length")
    return pooling, max_len


def pool(
    pooling: str,
    token_embeddings: torch.Tensor,
    attention_mask: torch.Tensor,
    hidden_states: tuple[torch.Tensor, ...] | None = None,
) -> torch.Tensor:
    """Reduce token states [B, T, H] to one vector per sentence [B, H]; padding never counts."""
    if pooling == "cls":
        return token_embeddings[:, 0]
    if pooling == "first_last_avg":
        # SimCSE's avg_first_last: hidden_states[0] is the embedding layer, [1] the first block.
        token_embeddings = (hidden_states[1] + hidden_states[-1]) / 2.0
    elif pooling != "mean":
        raise ValueError(f"unknown pooling {pooling!r}; choose from {POOLINGS}")
    # A batched matmul, not sum(1): onnxruntime's ReduceSum adds in another order when the batch has
    # one row, so a text served alone would differ in the last bits from the same text in a batch.
    mask = attention_mask.to(token_embeddings.dtype)
    summed = torch.bmm(mask.unsqueeze(1), token_embeddings).squeeze(1)
    return summed / mask.sum(1, keepdim=True).clamp(min=1e-9)


class SentenceEncoder(nn.Module):
    """transformer → pooling → optional head. `forward` returns the *unnormalised* embedding."""

    def __init__(
        self,
        transformer: nn.Module,
        tokenizer,
        pooling: str = "mean",
        max_seq_length: int = DEFAULT_MAX_SEQ_LENGTH,
        head: nn.Module | None = None,
        base_model: str = "",
    ):
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"unknown pooling {pooling!r}; choose from {POOLINGS}")
        self.transformer = transformer
        self.tokenizer = tokenizer
        self.pooling = pooling
        self.max_seq_length = max_seq_length
        self.head = head
        self.base_model = base_model

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | Path,
        pooling: str | None = None,
        max_seq_length: int | None = None,
        attn_implementation: str = "eager",
    ) -> SentenceEncoder:
        """Load a local HF / sentence-transformers directory, or a hub name when online.

        Pooling and max length follow the model's own sentence-transformers config when it has one;
        a plain HF checkpoint falls back to mean pooling and min(256, model limit).
        `attn_implementation`: training asks for "sdpa" (fused attention; eager where the architecture
        lacks it); the default stays "eager", which the ONNX export traces.
        """
        st_pooling, st_max_len = (None, None)
        if Path(name_or_path).is_dir():
            st_pooling, st_max_len = read_st_config(name_or_path)
        config = AutoConfig.from_pretrained(name_or_path)
        extra = {"add_pooling_layer": False} if config.model_type in ("bert", "roberta") else {}
        try:
            transformer = AutoModel.from_pretrained(
                name_or_path, config=config, attn_implementation=attn_implementation, **extra
            )
        except ValueError:  # an architecture without SDPA support: the eager attention it has
            if attn_implementation != "sdpa":
                raise
            transformer = AutoModel.from_pretrained(name_or_path, config=config, attn_implementation="eager", **extra)
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, use_fast=True)
        limit = getattr(config, "max_position_embeddings", 512)
        if config.model_type == "roberta":
            limit -= 2  # RoBERTa's position ids start after the padding index
        max_len = max_seq_length or st_max_len or min(DEFAULT_MAX_SEQ_LENGTH, limit)
        head_file = Path(name_or_path) / "head.pt"
        head = torch.load(head_file, weights_only=False) if head_file.is_file() else None
        return cls(
            transformer,
            tokenizer,
            pooling=pooling or st_pooling or "mean",
            max_seq_length=min(max_len, limit),
            head=head,
            base_model=str(name_or_path),
        )

    @property
    def dim(self) -> int:
        if self.head is not None and hasattr(self.head, "out_features"):
            return self.head.out_features
        return self.transformer.config.hidden_size

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def uses_token_type_ids(self) -> bool:
        return "token_type_ids" in self.tokenizer.model_input_names

    def tokenize(self, texts: list[str], pairs: list[str] | None = None, max_length: int | None = None):
        """Pad to the longest in the batch and truncate to the model's limit (pairs: longest first)."""
        return self.tokenizer(
            texts,
            pairs,
            padding=True,
            truncation=True,
            max_length=max_length or self.max_seq_length,
            return_tensors="pt",
        )

    def transformer_outputs(self, input_ids, attention_mask, token_type_ids=None, output_hidden_states=False):
        kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            kwargs["token_type_ids"] = token_type_ids
        return self.transformer(**kwargs, output_hidden_states=output_hidden_states, return_dict=True)

    def forward(self, input_ids, attention_mask, token_type_ids=None) -> torch.Tensor:
        out = self.transformer_outputs(
            input_ids, attention_mask, token_type_ids, output_hidden_states=self.pooling == "first_last_avg"
        )
        pooled = pool(self.pooling, out.last_hidden_state, attention_mask, out.hidden_states)
        return self.head(pooled) if self.head is not None else pooled

    @torch.no_grad()
    def encode(self, texts: list[str], batch_size: int = 64, normalize: bool = True) -> np.ndarray:
        """Embed texts in eval mode (no dropout), sorted by length so padding stays small."""
        was_training = self.training
        self.eval()
        order = np.argsort([-len(t) for t in texts], kind="stable")
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(texts), batch_size):
            idx = order[start : start + batch_size]
            batch = self.tokenize([texts[i] for i in idx]).to(self.device)
            emb = self(**{k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids")})
            if normalize:
                emb = torch.nn.functional.normalize(emb, dim=-1)
            out[idx] = emb.float().cpu().numpy()
        self.train(was_training)
        return out

    def save_pretrained(self, out_dir: str | Path) -> None:
        """A sentence-transformers-style directory; a head is saved as head.pt beside it."""
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        self.transformer.save_pretrained(out_dir)
        self.tokenizer.save_pretrained(out_dir)
        (out_dir / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": self.max_seq_length}))
        (out_dir / "1_Pooling").mkdir(exist_ok=True)
        (out_dir / "1_Pooling" / "config.json").write_text(
            json.dumps(
                {
                    "word_embedding_dimension": self.transformer.config.hidden_size,
                    "pooling_mode_cls_token": self.pooling == "cls",
                    "pooling_mode_mean_tokens": self.pooling == "mean",
                    "pooling_mode_first_last_avg": self.pooling == "first_last_avg",
                }
            )
        )
        if self.head is not None:
            torch.save(self.head, out_dir / "head.pt")
