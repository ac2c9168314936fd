"""The interaction-based (cross-encoder) scorer of CoSENT §III-B-3 (Fig. 2c): one score per sentence pair.

    "[CLS] s1 [SEP] s2 [SEP]" → transformer → [CLS] state → dropout → linear → f(s1, s2)

It gives no sentence embedding, so it is its own model beside SentenceEncoder: it saves as the
transformer's HF directory plus `cross_encoder.json` and the head's weights in safetensors (no
pickle), and export/exporter.py turns it into a graph that returns one score per pair.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import PreTrainedModel

from core.encoder import SentenceEncoder, forward_inputs, model_inputs, takes_token_type_ids

CONFIG_FILE = "cross_encoder.json"
HEAD_FILE = "score_head.safetensors"


def tokenize_pairs(tokenizer, first: list[str], second: list[str], max_length: int) -> dict[str, torch.Tensor]:
    """Each pair as one sequence, padded to the batch's longest; too long: the longer side is cut first."""
    return model_inputs(tokenizer(first, second, padding=True, truncation="longest_first", max_length=max_length,
                                  return_tensors="pt"))


def is_cross_encoder_dir(path: str | Path) -> bool:
    return (Path(path) / CONFIG_FILE).is_file()


class CrossEncoder(nn.Module):
    """transformer → [CLS] → linear: `forward` returns the logit f(i, j) of each pair, [B].

    `dropout` before the linear layer follows the usual sequence-classification head (the paper
    says only "fully connected layer"); it is active in training mode only.
    """

    def __init__(self, transformer: PreTrainedModel, tokenizer, max_seq_length: int, dropout: float = 0.1,
                 base_model: str = ""):
        super().__init__()
        self.transformer = transformer
        self.tokenizer = tokenizer
        self.max_seq_length = max_seq_length
        self.dropout_p = dropout
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(transformer.config.hidden_size, 1)
        self.base_model = base_model

    @classmethod
    def from_encoder(cls, encoder: SentenceEncoder, dropout: float = 0.1) -> CrossEncoder:
        """A fresh head on the encoder's transformer (shared, not copied: training updates both)."""
        return cls(encoder.transformer, encoder.tokenizer, encoder.max_seq_length, dropout, encoder.base_model)

    @classmethod
    def from_pretrained(cls, path: str | Path) -> CrossEncoder:
        path = Path(path)
        config = json.loads((path / CONFIG_FILE).read_text())
        encoder = SentenceEncoder.from_pretrained(path, max_seq_length=config["max_seq_length"])
        model = cls(encoder.transformer, encoder.tokenizer, encoder.max_seq_length, config["dropout"],
                    config.get("base_model", ""))
        model.classifier.load_state_dict(load_file(path / HEAD_FILE))
        return model

    def save_pretrained(self, out_dir: str | Path) -> None:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        self.transformer.save_pretrained(out_dir)
        self.tokenizer.save_pretrained(out_dir)
        save_file({k: v.detach().cpu().contiguous() for k, v in self.classifier.state_dict().items()},
                  out_dir / HEAD_FILE)
        (out_dir / CONFIG_FILE).write_text(json.dumps({"max_seq_length": self.max_seq_length,
                                                       "dropout": self.dropout_p, "base_model": self.base_model}))

    @property
    def device(self) -> torch.device:
        return self.classifier.weight.device

    @property
    def uses_token_type_ids(self) -> bool:
        return takes_token_type_ids(self.tokenizer, self.transformer)

    def tokenize(self, first: list[str], second: list[str]) -> dict[str, torch.Tensor]:
        return tokenize_pairs(self.tokenizer, first, second, self.max_seq_length)

    def forward(self, input_ids, attention_mask, token_type_ids=None) -> torch.Tensor:
        cls = self.transformer(**forward_inputs(input_ids, attention_mask, token_type_ids),
                               return_dict=True).last_hidden_state[:, 0]
        return self.classifier(self.dropout(cls)).squeeze(-1)

    @torch.no_grad()
    def score_pairs(self, first: list[str], second: list[str], batch_size: int = 64) -> np.ndarray:
        """f(first[i], second[i]) for each i, in eval mode, in length-sorted batches."""
        was_training = self.training
        self.eval()
        order = np.argsort([-(len(a) + len(b)) for a, b in zip(first, second)], kind="stable")
        out = np.zeros(len(first), dtype=np.float32)
        for start in range(0, len(first), batch_size):
            idx = order[start : start + batch_size]
            feats = self.tokenize([first[i] for i in idx], [second[i] for i in idx])
            out[idx] = self(**{k: v.to(self.device) for k, v in feats.items()}).float().cpu().numpy()
        self.train(was_training)
        return out


#: the activations a reranker's manifest may name, which the service applies to the graph's logit
SCORE_ACTIVATIONS = ("Sigmoid", "Identity", "Tanh")


def sequence_classifier_head(path: str | Path) -> str | None:
    """The *ForSequenceClassification architecture a directory's config.json names, or None."""
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        return None
    heads = [a for a in json.loads(config_file.read_text()).get("architectures") or []
             if a.endswith("ForSequenceClassification")]
    return heads[0] if heads else None


class PairScorer(nn.Module):
    """A Hugging Face *ForSequenceClassification as sentence-transformers' CrossEncoder scores with it: its own
    head (BERT's pooler included). With one label it is a reranker: `forward` gives the logit of each pair, [B];
    `activation` names what CrossEncoder.predict applies to it (the config's `sentence_transformers.activation_fn`,
    else Sigmoid), which the service applies unless asked for raw scores. With several it is a classifier of
    texts or pairs: `forward` gives every label's logit, [B, labels]. It is a CrossEncoder for the export
    (tokenize, uses_token_type_ids, max_seq_length)."""

    def __init__(self, model: PreTrainedModel, tokenizer, max_seq_length: int, activation: str = "Sigmoid",
                 base_model: str = ""):
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        self.max_seq_length = max_seq_length
        self.activation = activation
        self.base_model = base_model

    @classmethod
    def from_pretrained(cls, path: str | Path, max_seq_length: int | None = None,
                        trust_remote_code: bool = False) -> PairScorer:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        from core import families

        remote = {"trust_remote_code": True} if trust_remote_code else {}
        model = AutoModelForSequenceClassification.from_pretrained(path, attn_implementation="eager", **remote)
        config = model.config
        activation_path = (getattr(config, "sentence_transformers", None) or {}).get("activation_fn") \
            or "torch.nn.modules.activation.Sigmoid"
        activation = activation_path.rsplit(".", 1)[-1]
        if activation not in SCORE_ACTIVATIONS:
            raise ValueError(f"unsupported CrossEncoder activation {activation_path!r} in {path}: known "
                             f"{', '.join(SCORE_ACTIVATIONS)}")
        tokenizer = AutoTokenizer.from_pretrained(path, use_fast=True, **remote)
        limit = families.family_of(config).checked_limit(config, max_seq_length)
        # CrossEncoder's length: the tokenizer's model_max_length (512 where it states none sensibly)
        own = tokenizer.model_max_length if tokenizer.model_max_length < 1_000_000 else 512
        length = max_seq_length or min(own, limit or own)
        return cls(model, tokenizer, length, activation, str(path))

    @property
    def labels(self) -> int:
        return int(self.model.config.num_labels or 1)

    @property
    def id2label(self) -> dict[str, str]:
        return {str(i): str(label) for i, label in (self.model.config.id2label or {}).items()}

    @property
    def multi_label(self) -> bool:
        return self.model.config.problem_type == "multi_label_classification"

    @property
    def uses_token_type_ids(self) -> bool:
        return takes_token_type_ids(self.tokenizer, self.model)

    def tokenize(self, first: list[str], second: list[str]) -> dict[str, torch.Tensor]:
        return tokenize_pairs(self.tokenizer, first, second, self.max_seq_length)

    def forward(self, input_ids, attention_mask, token_type_ids=None) -> torch.Tensor:
        logits = self.model(**forward_inputs(input_ids, attention_mask, token_type_ids), return_dict=True).logits
        return logits[:, 0] if self.labels == 1 else logits
