"""A sentence-transformers SparseEncoder (SPLADE) as one torch module: masked-LM logits to a vocabulary-sized vector.

    text → MLM transformer → logits [B, S, V] → log(1 + relu(·)) (twice for log1p_relu) over the real tokens
         → max (or sum) over the sequence → [B, V]

What `SpladePooling` computes, read from the directory SparseEncoder.save writes (modules.json: an MLMTransformer,
or a Transformer with transformer_task "fill-mask", then SpladePooling), without importing sentence-transformers.
Any other module (SparseStaticEmbedding, a Router's inference-free query side, SparseAutoEncoder) is refused by
name: the export would serve other vectors than the model's.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn
from transformers import PreTrainedModel

from core.encoder import forward_inputs, takes_token_type_ids

POOLING_STRATEGIES = ("max", "sum")
ACTIVATIONS = ("relu", "log1p_relu")
_MLM_TYPES = ("MLMTransformer", "Transformer")
#: SparseEncoder's length where neither the module's config nor the tokenizer states a sensible one
DEFAULT_MAX_SEQ_LENGTH = 512


def _modules(model_dir: Path) -> list[dict]:
    modules_file = model_dir / "modules.json"
    return json.loads(modules_file.read_text()) if modules_file.is_file() else []


def is_sparse_encoder_dir(path: str | Path) -> bool:
    """A directory SparseEncoder.save wrote: its modules name SpladePooling (or another sparse module, which
    `SpladeEncoder.from_pretrained` then refuses by name), or its config says model_type SparseEncoder."""
    path = Path(path)
    if not path.is_dir():
        return False
    kinds = [m.get("type", "") for m in _modules(path)]
    if any(".sparse_encoder." in kind for kind in kinds):
        return True
    st_config = path / "config_sentence_transformers.json"
    return st_config.is_file() and json.loads(st_config.read_text()).get("model_type") == "SparseEncoder"


def read_splade_modules(model_dir: str | Path) -> dict:
    """{"transformer_dir", "max_seq_length" (if stated), "pooling_strategy", "activation", "prompts",
    "default_prompt_name", "max_active_dims"} of a SparseEncoder directory; a ValueError naming what the graph
    cannot reproduce."""
    model_dir = Path(model_dir)
    modules = _modules(model_dir)
    kinds = [m.get("type", "").rsplit(".", 1)[-1] for m in modules]
    if len(modules) != 2 or kinds[0] not in _MLM_TYPES or kinds[1] != "SpladePooling":
        raise ValueError(f"unsupported SparseEncoder modules {kinds} in {model_dir / 'modules.json'}: the export "
                         "reproduces an MLM transformer followed by SpladePooling (SPLADE), nothing else")
    transformer_dir = model_dir / modules[0].get("path", "")
    out: dict = {"transformer_dir": transformer_dir}
    st_file = transformer_dir / "sentence_bert_config.json"
    st_config = json.loads(st_file.read_text()) if st_file.is_file() else {}
    task = st_config.get("transformer_task", "fill-mask" if kinds[0] == "MLMTransformer" else None)
    if task != "fill-mask":
        raise ValueError(f"{transformer_dir}: a Transformer with transformer_task {task!r} before SpladePooling; "
                         "SPLADE needs the masked-LM head (transformer_task 'fill-mask')")
    max_len = st_config.get("max_seq_length")
    tok_file = transformer_dir / "tokenizer_config.json"
    if max_len is None and tok_file.is_file():  # sentence-transformers >= 6 keeps it as the tokenizer's
        tok_max = json.loads(tok_file.read_text()).get("model_max_length")
        max_len = tok_max if isinstance(tok_max, int) and tok_max < 1_000_000 else None
    if max_len:
        out["max_seq_length"] = int(max_len)
    pooling_dir = model_dir / modules[1].get("path", "")
    pooling = json.loads((pooling_dir / "config.json").read_text()) if (pooling_dir / "config.json").is_file() else {}
    out["pooling_strategy"] = pooling.get("pooling_strategy", "max")
    out["activation"] = pooling.get("activation_function", "relu")
    if out["pooling_strategy"] not in POOLING_STRATEGIES:
        raise ValueError(f"unsupported SpladePooling pooling_strategy {out['pooling_strategy']!r} in {pooling_dir}: "
                         f"known {', '.join(POOLING_STRATEGIES)}")
    if out["activation"] not in ACTIVATIONS:
        raise ValueError(f"unsupported SpladePooling activation_function {out['activation']!r} in {pooling_dir}: "
                         f"known {', '.join(ACTIVATIONS)}")
    config_file = model_dir / "config_sentence_transformers.json"
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    out["prompts"] = {str(k): str(v) for k, v in (config.get("prompts") or {}).items()}
    out["default_prompt_name"] = config.get("default_prompt_name")
    out["max_active_dims"] = config.get("max_active_dims")
    return out


class SpladeEncoder(nn.Module):
    """The MLM transformer and SpladePooling: `forward` returns each text's vocabulary-sized SPLADE vector [B, V].

    `max_active_dims` (the model's config) is what SparseEncoder.encode keeps of each vector by default (the
    largest values); the graph gives the whole vector and the service prunes it."""

    def __init__(self, model: PreTrainedModel, tokenizer, max_seq_length: int, pooling_strategy: str = "max",
                 activation: str = "relu", max_active_dims: int | None = None, prompts: dict[str, str] | None = None,
                 default_prompt_name: str | None = None, base_model: str = ""):
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        self.max_seq_length = max_seq_length
        self.pooling_strategy = pooling_strategy
        self.activation = activation
        self.max_active_dims = max_active_dims
        self.prompts = dict(prompts or {})
        self.default_prompt_name = default_prompt_name
        self.base_model = base_model

    @classmethod
    def from_pretrained(cls, path: str | Path, max_seq_length: int | None = None,
                        trust_remote_code: bool = False) -> SpladeEncoder:
        from transformers import AutoConfig, AutoModelForMaskedLM, AutoTokenizer

        from core import families

        st = read_splade_modules(path)
        model_path = st["transformer_dir"]
        remote = {"trust_remote_code": True} if trust_remote_code else {}
        config = AutoConfig.from_pretrained(model_path, **remote)
        family = families.family_of(config)
        # not the family's load_kwargs: those are AutoModel's (BERT's add_pooling_layer), which an MLM model has none of
        model = AutoModelForMaskedLM.from_pretrained(model_path, config=config, attn_implementation="eager", **remote)
        tokenizer = AutoTokenizer.from_pretrained(model_path, use_fast=True, **remote)
        limit = family.checked_limit(config, max_seq_length)
        length = max_seq_length or st.get("max_seq_length") or min(DEFAULT_MAX_SEQ_LENGTH, limit or 1 << 30)
        return cls(model, tokenizer, min(length, limit or length), st["pooling_strategy"], st["activation"],
                   st["max_active_dims"], st["prompts"], st["default_prompt_name"], str(path))

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    @property
    def uses_token_type_ids(self) -> bool:
        return takes_token_type_ids(self.tokenizer, self.model)

    def tokenize(self, texts: list[str]) -> dict[str, torch.Tensor]:
        return self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_seq_length,
                              return_tensors="pt")

    def forward(self, input_ids, attention_mask, token_type_ids=None) -> torch.Tensor:
        logits = self.model(**forward_inputs(input_ids, attention_mask, token_type_ids), return_dict=True).logits
        masked = logits * attention_mask.unsqueeze(-1).to(logits.dtype)  # padding counts as 0, as SpladePooling's
        if self.pooling_strategy == "max":
            # log1p(relu(x)) never decreases with x, so the max may come first: the activation then runs on [B, V],
            # not on [B, S, V]
            return self._activate(masked.max(dim=1).values)
        return self._activate(masked).sum(dim=1)

    def _activate(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.log1p(torch.relu(x))
        return torch.log1p(x) if self.activation == "log1p_relu" else x
