"""The trainable sentence encoder: a Hugging Face transformer, a pooling rule and an optional head.

This is the one torch model every objective trains and the exporter turns into ONNX. Objectives
that need more (projection heads, auxiliary networks) own those modules themselves; only what the
served embedding depends on lives here.
"""

from __future__ import annotations

import inspect
import json
import logging
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
import transformers
from torch import nn
from transformers import AutoConfig, AutoModel, AutoTokenizer, PreTrainedModel

from core import families
from core.pooling import FIRST_LAST_AVG, MODES, LayerWeights, modes_of, name_of, pool

# What a transformer's forward takes from a tokenizer's output (offsets, overflow and the rest stay behind).
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
DEFAULT_MAX_SEQ_LENGTH = 256


# sentence-transformers module types, in the spelling every version since 2.0 loads (6.x maps them).
ST_TYPES = {name: f"sentence_transformers.models.{name}"
            for name in ("Transformer", "Pooling", "Dense", "Normalize", "WeightedLayerPooling")}
# Dense activations a saved directory may name: looked up here, never imported from the file's string.
ACTIVATIONS = {"Identity": nn.Identity, "Tanh": nn.Tanh, "ReLU": nn.ReLU, "GELU": nn.GELU, "Sigmoid": nn.Sigmoid}
log = logging.getLogger("sembed.encoder")
# the pre-6.0 spelling of each mode: one boolean per mode
_ST_FLAGS = {"cls": "pooling_mode_cls_token", "max": "pooling_mode_max_tokens", "mean": "pooling_mode_mean_tokens",
             "mean_sqrt_len_tokens": "pooling_mode_mean_sqrt_len_tokens",
             "weightedmean": "pooling_mode_weightedmean_tokens", "lasttoken": "pooling_mode_lasttoken"}


class Dense(nn.Module):
    """sentence-transformers' Dense module: activation(linear(x)), saved as config + safetensors."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, activation: str = "Identity"):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"unsupported Dense activation {activation!r}; known: {', '.join(ACTIVATIONS)}")
        self.linear = nn.Linear(in_features, out_features, bias=bias)
        self.activation = ACTIVATIONS[activation]()
        self.activation_name = activation

    @property
    def out_features(self) -> int:
        return self.linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.activation(self.linear(x))


class DenseStack(nn.Sequential):
    """A head loaded from Dense modules; `out_features` is what SentenceEncoder.dim reads."""

    @property
    def out_features(self) -> int:
        return cast(Dense, self[-1]).out_features


def head_as_dense(head: nn.Module) -> list[Dense]:
    """Any head made of Linear layers, each followed by at most one known activation, as Dense modules.

    Objectives build heads from plain nn.Linear / activations (CLSR's e, SimCSE's MLP, chains of them);
    sentence-transformers can only load such layers, so anything else (e.g. BatchNorm) is refused.
    """
    def flat(m: nn.Module) -> list[nn.Module]:
        if isinstance(m, nn.Sequential):
            return [x for child in m for x in flat(child)]
        return [m]

    out: list[Dense] = []
    for layer in flat(head):
        if isinstance(layer, Dense):
            out.append(layer)
        elif isinstance(layer, nn.Linear):
            dense = Dense(layer.in_features, layer.out_features, bias=layer.bias is not None)
            dense.linear.load_state_dict(layer.state_dict())
            out.append(dense)
        elif type(layer).__name__ in ACTIVATIONS and out and out[-1].activation_name == "Identity":
            out[-1].activation = layer
            out[-1].activation_name = type(layer).__name__
        else:
            raise ValueError(f"head layer {type(layer).__name__} cannot be saved as sentence-transformers "
                             "Dense modules (Linear + one activation: " + ", ".join(ACTIVATIONS) + ")")
    return out


def _load_weights(module_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    if (module_dir / "model.safetensors").is_file():
        return load_file(module_dir / "model.safetensors")
    if (module_dir / "pytorch_model.bin").is_file():  # sentence-transformers < 3 wrote these
        return torch.load(module_dir / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"no weights (model.safetensors) in {module_dir}")


def _pooling_from_config(cfg: dict, where: Path) -> str:
    """A Pooling module's config as a pooling name ("mean", "cls+mean"); what it cannot reproduce is refused."""
    if cfg.get("include_prompt", True) is False:  # INSTRUCTOR-style: the prompt's tokens left out of the mean
        raise ValueError(f"unsupported pooling option include_prompt=false in {where}: the graph pools every token")
    mode = cfg.get("pooling_mode")
    if mode is None:  # the pre-6.0 spelling
        modes = [m for m, flag in _ST_FLAGS.items() if cfg.get(flag)] or ["mean"]
    else:
        modes = [mode] if isinstance(mode, str) else list(mode)
    if modes == [FIRST_LAST_AVG]:  # what this project wrote before its directories were real ST ones
        return FIRST_LAST_AVG
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise ValueError(f"unsupported pooling {unknown[0]!r} in {where}: known modes are {', '.join(MODES)}")
    return name_of(modes)


def read_st_modules(model_dir: str | Path) -> dict:
    """What a sentence-transformers directory says beyond its transformer, as SentenceEncoder fields.

    {"pooling", "layer_weights", "max_seq_length", "head", "normalize", "transformer_dir", "prompts",
    "default_prompt_name"}, each present only if the directory states it. Reads modules.json when there is
    one (any module besides Transformer, WeightedLayerPooling, Pooling, Dense and Normalize is refused by
    name); a directory with only 1_Pooling/ and sentence_bert_config.json (an older export of ours) is read
    from those.
    """
    model_dir = Path(model_dir)
    out: dict = {}
    modules_file = model_dir / "modules.json"
    modules = json.loads(modules_file.read_text()) if modules_file.is_file() else [
        {"type": ST_TYPES["Transformer"], "path": ""}] + (
        [{"type": ST_TYPES["Pooling"], "path": "1_Pooling"}] if (model_dir / "1_Pooling").is_dir() else [])
    dense: list[Dense] = []
    layer_weights: LayerWeights | None = None
    for module in modules:
        kind = module["type"].rsplit(".", 1)[-1]
        path = model_dir / module.get("path", "")
        config = json.loads((path / "config.json").read_text()) if (path / "config.json").is_file() else {}
        if kind == "Transformer":
            out["transformer_dir"] = path
            st_file, tok_file = path / "sentence_bert_config.json", path / "tokenizer_config.json"
            max_len = json.loads(st_file.read_text()).get("max_seq_length") if st_file.is_file() else None
            if max_len is None and modules_file.is_file() and tok_file.is_file():
                # sentence-transformers >= 6 keeps the length as the tokenizer's model_max_length
                tok_max = json.loads(tok_file.read_text()).get("model_max_length")
                max_len = tok_max if isinstance(tok_max, int) and tok_max < 1_000_000 else None
            if max_len:
                out["max_seq_length"] = max_len
        elif kind == "WeightedLayerPooling":
            transformer_config = out.get("transformer_dir", model_dir) / "config.json"
            if not json.loads(transformer_config.read_text()).get("output_hidden_states"):
                # sentence-transformers passes the layers on only when the model's config says so, and
                # without them its WeightedLayerPooling passes the last layer through: so does this encoder
                log.warning("%s: WeightedLayerPooling without output_hidden_states in %s is skipped, as "
                            "sentence-transformers skips it", path, transformer_config)
                continue
            layer_weights = LayerWeights(config.get("layer_start", 4), _load_weights(path)["layer_weights"].tolist())
        elif kind == "Pooling":
            pooling = _pooling_from_config(config, path)
            if layer_weights is not None and layer_weights.is_first_last and pooling == "mean":
                pooling = FIRST_LAST_AVG  # SimCSE's avg_first_last, the spelling training uses
            elif layer_weights is not None:
                out["layer_weights"] = layer_weights
            out["pooling"] = pooling
        elif kind == "Dense":
            act = (config.get("activation_function") or "torch.nn.modules.linear.Identity").rsplit(".", 1)[-1]
            layer = Dense(config["in_features"], config["out_features"], config.get("bias", True), act)
            layer.linear.load_state_dict({k.removeprefix("linear."): v for k, v in _load_weights(path).items()})
            dense.append(layer)
        elif kind == "Normalize":
            out["normalize"] = True
        else:
            raise ValueError(f"unsupported sentence-transformers module {module['type']} in {modules_file}")
    if modules_file.is_file():
        out.setdefault("normalize", False)
    st_config = model_dir / "config_sentence_transformers.json"
    if st_config.is_file():
        st = json.loads(st_config.read_text())
        out["prompts"] = {str(k): str(v) for k, v in (st.get("prompts") or {}).items()}
        out["default_prompt_name"] = st.get("default_prompt_name")
    if dense:
        out["head"] = DenseStack(*dense)
    elif not modules_file.is_file() and (model_dir / "head.pt").is_file():
        # a best/ written before these directories were real sentence-transformers ones pickled its head;
        # unpickling runs code from the file, and dropping the head silently would serve another model
        raise ValueError(f"{model_dir / 'head.pt'} is a pickled head, which is never loaded: unpickle it once where "
                         "the file is trusted and save_pretrained() the encoder (config + safetensors)")
    return out


def model_inputs(features: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in features.items() if k in MODEL_INPUTS}


def forward_inputs(input_ids, attention_mask, token_type_ids=None) -> dict[str, torch.Tensor]:
    """A transformer's keyword arguments; token type ids only where the graph has them."""
    kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
    return kwargs if token_type_ids is None else {**kwargs, "token_type_ids": token_type_ids}


def takes_token_type_ids(tokenizer, model: nn.Module) -> bool:
    """The tokenizer gives them and the model takes them (a decoder's tokenizer may name them, unused)."""
    return ("token_type_ids" in tokenizer.model_input_names
            and "token_type_ids" in inspect.signature(model.forward).parameters)


class SentenceEncoder(nn.Module):
    """transformer → pooling → optional head. `forward` returns the *unnormalised* embedding."""

    def __init__(
        self,
        transformer: PreTrainedModel,
        tokenizer,
        pooling: str = "mean",
        max_seq_length: int = DEFAULT_MAX_SEQ_LENGTH,
        head: nn.Module | None = None,
        base_model: str = "",
        normalize: bool = True,
        layer_weights: LayerWeights | None = None,
        prompts: dict[str, str] | None = None,
        default_prompt_name: str | None = None,
    ):
        super().__init__()
        modes_of(pooling)  # a ValueError naming the known poolings
        self.transformer = transformer
        self.tokenizer = tokenizer
        self.pooling = pooling
        self.layer_weights = layer_weights  # a WeightedLayerPooling before the pooling (other than first_last_avg)
        # sentence-transformers' prompts: text put before the input ("query: "), by name; one may be the default
        self.prompts = dict(prompts or {})
        self.default_prompt_name = default_prompt_name
        if default_prompt_name is not None and default_prompt_name not in self.prompts:
            raise ValueError(f"default_prompt_name {default_prompt_name!r} is not one of the prompts "
                             f"{sorted(self.prompts)}")
        self.max_seq_length = max_seq_length
        self.head = head
        self.base_model = base_model
        self.normalize = normalize  # encode()'s default, and a Normalize module when saved

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | Path,
        pooling: str | None = None,
        max_seq_length: int | None = None,
        attn_implementation: str = "eager",
        trust_remote_code: bool = False,
    ) -> SentenceEncoder:
        """Load a local HF / sentence-transformers directory, or a hub name when online.

        A sentence-transformers directory is read as sentence-transformers reads it (read_st_modules):
        pooling, max length, Dense head, Normalize. A plain HF checkpoint pools as its family does (mean for
        encoders, the last token for decoders), takes min(256, model limit) tokens and normalises.
        `pooling` / `max_seq_length` override; a `max_seq_length` past the position table is refused, naming
        the table's limit. `attn_implementation`: training asks for "sdpa" (fused attention; eager where the
        architecture lacks it); the default stays "eager", which the ONNX export traces.
        `trust_remote_code`: run the model's own code from its directory (only when the user says so).
        """
        st = read_st_modules(name_or_path) if Path(name_or_path).is_dir() else {}
        model_path = st.get("transformer_dir", name_or_path)
        remote = {"trust_remote_code": True} if trust_remote_code else {}
        config = AutoConfig.from_pretrained(model_path, **remote)
        family = families.family_of(config)
        extra = {**family.load_kwargs(config), **remote}
        try:
            transformer = AutoModel.from_pretrained(
                model_path, config=config, attn_implementation=attn_implementation, **extra
            )
        except ValueError:  # an architecture without SDPA support: the eager attention it has
            if attn_implementation != "sdpa":
                raise
            transformer = AutoModel.from_pretrained(model_path, config=config, attn_implementation="eager", **extra)
        family.prepare(transformer)
        tokenizer = AutoTokenizer.from_pretrained(model_path, use_fast=True, **remote)
        if tokenizer.pad_token is None and tokenizer.eos_token is not None:
            # a decoder's tokenizer may have none: any id does where the attention mask hides it
            tokenizer.pad_token = tokenizer.eos_token
        limit = family.checked_limit(config, max_seq_length)
        max_len = max_seq_length or st.get("max_seq_length") or min(DEFAULT_MAX_SEQ_LENGTH, limit or 1 << 30)
        if pooling and st.get("pooling") and pooling != st["pooling"]:
            # a trained model's vectors come from its own pooling: all-MiniLM-L6-v2 with cls pooling retrieves far
            # worse (RESULTS.md, issue 23)
            log.warning("%s was trained with %s pooling: with %s pooling its vectors are not the ones it was trained "
                        "for", name_or_path, st["pooling"], pooling)
        return cls(
            transformer,
            tokenizer,
            pooling=pooling or st.get("pooling") or family.default_pooling,
            max_seq_length=min(max_len, limit or max_len),
            head=st.get("head"),
            base_model=str(name_or_path),
            normalize=st.get("normalize", True),
            layer_weights=None if pooling else st.get("layer_weights"),
            prompts=st.get("prompts"),
            default_prompt_name=st.get("default_prompt_name"),
        )

    @property
    def dim(self) -> int:
        out_features = getattr(self.head, "out_features", None)  # Dense heads, CLSR's e
        if isinstance(out_features, int):
            return out_features
        linears = [m for m in self.head.modules() if isinstance(m, nn.Linear)] if self.head is not None else []
        return linears[-1].out_features if linears else self.transformer.config.hidden_size

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def uses_token_type_ids(self) -> bool:
        return takes_token_type_ids(self.tokenizer, self.transformer)

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

    @property
    def needs_hidden_states(self) -> bool:
        return self.pooling == FIRST_LAST_AVG or self.layer_weights is not None

    def transformer_outputs(self, input_ids, attention_mask, token_type_ids=None, output_hidden_states=False):
        return self.transformer(**forward_inputs(input_ids, attention_mask, token_type_ids),
                                output_hidden_states=output_hidden_states, return_dict=True)

    def forward(self, input_ids, attention_mask, token_type_ids=None) -> torch.Tensor:
        out = self.transformer_outputs(input_ids, attention_mask, token_type_ids,
                                       output_hidden_states=self.needs_hidden_states)
        pooled = pool(self.pooling, out.last_hidden_state, attention_mask, out.hidden_states, self.layer_weights)
        return self.head(pooled) if self.head is not None else pooled

    @torch.no_grad()
    def encode(self, texts: list[str], batch_size: int = 64, normalize: bool | None = None) -> np.ndarray:
        """Embed texts in eval mode (no dropout), sorted by length so padding stays small.

        normalize: None follows the model (`self.normalize`), as SentenceTransformer.encode does.
        """
        normalize = self.normalize if normalize is None else normalize
        was_training = self.training
        self.eval()
        order = np.argsort([-len(t) for t in texts], kind="stable")
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(texts), batch_size):
            idx = order[start : start + batch_size]
            batch = self.tokenize([texts[i] for i in idx]).to(self.device)
            emb = self(**model_inputs(batch))
            if normalize:
                emb = torch.nn.functional.normalize(emb, dim=-1)
            out[idx] = emb.float().cpu().numpy()
        self.train(was_training)
        return out

    def save_pretrained(self, out_dir: str | Path) -> None:
        """A sentence-transformers directory: `SentenceTransformer(out_dir)` embeds as this encoder does.

        The HF model and tokenizer at the root (safetensors), then 1_Pooling, a head as Dense modules,
        2_Normalize when this encoder normalises; a layer pooling (first_last_avg: layers 1..L with weight on
        the first and last only) is ST's WeightedLayerPooling before Pooling. Prompts are kept. No pickles.
        """
        from safetensors.torch import save_file

        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        dense = head_as_dense(self.head) if self.head is not None else []
        config = self.transformer.config
        layer_weights = (LayerWeights.first_last(config.num_hidden_layers) if self.pooling == FIRST_LAST_AVG
                         else self.layer_weights)
        saved_flag = config.output_hidden_states
        config.output_hidden_states = layer_weights is not None  # ST's Transformer passes every layer on only when told
        try:
            self.transformer.save_pretrained(out_dir)
        finally:
            config.output_hidden_states = saved_flag
        self.tokenizer.save_pretrained(out_dir)
        _write_json(out_dir / "sentence_bert_config.json", {"max_seq_length": self.max_seq_length,
                                                            "do_lower_case": False})
        _write_json(out_dir / "config_sentence_transformers.json", {
            "__version__": {"transformers": transformers.__version__, "pytorch": torch.__version__},
            "prompts": self.prompts, "default_prompt_name": self.default_prompt_name,
            "similarity_fn_name": "cosine"})
        # (module type, folder, (config, weights) or None)
        modules: list[tuple[str, str, tuple[dict[str, Any], dict[str, torch.Tensor] | None] | None]] = [
            ("Transformer", "", None)]
        hidden = config.hidden_size
        if layer_weights is not None:
            modules.append(("WeightedLayerPooling", "WeightedLayerPooling", (
                {"word_embedding_dimension": hidden, "layer_start": layer_weights.start,
                 "num_hidden_layers": config.num_hidden_layers},
                {"layer_weights": layer_weights.weights})))
        # the pre-6.0 spelling, which every sentence-transformers version since 2.0 reads
        flags = {flag: mode in modes_of(self.pooling) for mode, flag in _ST_FLAGS.items()}
        modules.append(("Pooling", "Pooling", ({"word_embedding_dimension": hidden, **flags}, None)))
        for layer in dense:
            activation = type(layer.activation)
            modules.append(("Dense", "Dense", (
                {"in_features": layer.linear.in_features, "out_features": layer.out_features,
                 "bias": layer.linear.bias is not None,
                 "activation_function": f"{activation.__module__}.{activation.__qualname__}"},
                {f"linear.{k}": v for k, v in layer.linear.state_dict().items()})))
        if self.normalize:
            modules.append(("Normalize", "Normalize", ({}, None)))
        entries = []
        for idx, (kind, folder, content) in enumerate(modules):
            path = "" if kind == "Transformer" else f"{idx}_{folder}"
            entries.append({"idx": idx, "name": str(idx), "path": path, "type": ST_TYPES[kind]})
            if content is not None:
                (out_dir / path).mkdir(exist_ok=True)
                cfg, tensors = content
                _write_json(out_dir / path / "config.json", cfg)
                if tensors:
                    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()},
                              out_dir / path / "model.safetensors")
        _write_json(out_dir / "modules.json", entries)
        # a directory saved before over this one may hold modules this one has not
        kept = {e["path"] for e in entries}
        for stale in out_dir.glob("[0-9]_*"):
            if stale.is_dir() and stale.name not in kept:
                shutil.rmtree(stale)
        (out_dir / "head.pt").unlink(missing_ok=True)


def _write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n")
