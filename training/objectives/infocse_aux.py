"""InfoCSE's auxiliary network pieces (InfoCSE §3, Fig. 1-b): the MLM output head shared by both
MLM losses, the extra transformer layers over [h ; M>0], and the frozen lower-layer copy of stage 2.

They are kept apart from `infocse.py` so the objective reads as the paper's equations.

Condenser (Gao & Callan, 2021) is InfoCSE's stage 1 under another name: its pre-training loss is
the MLM of extra layers over [CLS ; skip-layer states] plus the encoder's own MLM ("late MLM"),
InfoCSE Eq. 4–6. A Condenser checkpoint is a *ForMaskedLM directory (the encoder and its MLM head,
"cls.predictions.*") with `model.pt` beside it holding the extra layers as "c_head.<i>.*" (its
save_pretrained drops the "lm.*" keys). `find_condenser_head_state` reads them for ExtraLayers.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers.masking_utils import create_bidirectional_mask
from transformers.models.bert.modeling_bert import BertPredictionHeadTransform

#: Where each model family keeps its MLM head in a *ForMaskedLM checkpoint, and how its names map
#: onto MLMHead's (BERT: BertOnlyMLMHead "cls.predictions.*"; RoBERTa: RobertaLMHead "lm_head.*").
_HEAD_KEYS = {
    "cls.predictions.": {
        "transform.dense.weight": "transform.dense.weight",
        "transform.dense.bias": "transform.dense.bias",
        "transform.LayerNorm.weight": "transform.LayerNorm.weight",
        "transform.LayerNorm.bias": "transform.LayerNorm.bias",
        "bias": "bias",
    },
    "lm_head.": {
        "dense.weight": "transform.dense.weight",
        "dense.bias": "transform.dense.bias",
        "layer_norm.weight": "transform.LayerNorm.weight",
        "layer_norm.bias": "transform.LayerNorm.bias",
        "bias": "bias",
    },
}


def init_bert_weights(module: nn.Module, std: float) -> None:
    """BERT's initialisation (N(0, std) weights, zero biases, unit LayerNorm), written out so it also
    re-initialises modules copied from a loaded checkpoint."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


class MLMHead(nn.Module):
    """BertOnlyMLMHead without the wrapper: transform (dense → act → LayerNorm) → W (decoder) + bias.

    W is the "output projection matrix W" of InfoCSE Eq. 4–5. It is tied to the word embeddings it
    is given (BERT's tying), so in stage 1 it is shared by L_mlm and L_aux and by the encoder's input
    embeddings; `untie()` gives it its own copy (stage 2, see InfoCSE.prepare).
    """

    def __init__(self, config, word_embeddings: nn.Embedding):
        super().__init__()
        self.transform = BertPredictionHeadTransform(config)
        self.decoder = nn.Linear(config.hidden_size, word_embeddings.num_embeddings, bias=False)
        self.decoder.weight = word_embeddings.weight
        self.bias = nn.Parameter(torch.zeros(word_embeddings.num_embeddings))
        init_bert_weights(self.transform, getattr(config, "initializer_range", 0.02))

    def untie(self) -> None:
        self.decoder.weight = nn.Parameter(self.decoder.weight.detach().clone())

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transform(hidden)) + self.bias

    def loss(self, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy over the labelled (masked) positions only: logits over the vocabulary
        are computed for those rows alone, which keeps a 30k-wide softmax affordable."""
        keep = labels != -100
        if not keep.any():
            return hidden.sum() * 0.0  # no masked token in the batch: a zero that keeps the graph
        logits = self(hidden[keep])
        return F.cross_entropy(logits.float(), labels[keep])


def find_mlm_head_state(model_dir: str | Path | None) -> dict[str, torch.Tensor] | None:
    """The MLM-head tensors of a local *ForMaskedLM checkpoint, renamed to MLMHead's keys.

    `model_dir` is a directory or a hub name already in the local cache. Reads model.safetensors
    (or its shards) or pytorch_model.bin; returns None when there is no such directory or it holds
    no "cls.predictions.*" / "lm_head.*" weights (a plain encoder such as all-MiniLM-L6-v2).
    The decoder weight is not read: it is tied to the word embeddings, which the encoder already
    loaded from the same checkpoint.
    """
    d = _local_dir(model_dir)
    if d is None:
        return None
    tensors: dict[str, torch.Tensor] = {}
    files = sorted(d.glob("*.safetensors"))
    if files:
        from safetensors import safe_open

        for f in files:
            with safe_open(str(f), framework="pt") as st:
                for k in st.keys():
                    if any(k.startswith(p) for p in _HEAD_KEYS):
                        tensors[k] = st.get_tensor(k)
    elif (d / "pytorch_model.bin").is_file():
        state = torch.load(d / "pytorch_model.bin", map_location="cpu", weights_only=True)
        tensors = {k: v for k, v in state.items() if any(k.startswith(p) for p in _HEAD_KEYS)}
    # TF-converted checkpoints (bert-base-uncased) name LayerNorm parameters gamma / beta
    tensors = {
        k.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias"): v
        for k, v in tensors.items()
    }
    for prefix, names in _HEAD_KEYS.items():
        out = {ours: tensors[prefix + theirs] for theirs, ours in names.items() if prefix + theirs in tensors}
        if "bias" not in out and prefix + "decoder.bias" in tensors:  # some exports keep only the decoder's
            out["bias"] = tensors[prefix + "decoder.bias"]
        if len(out) == len(names):
            return out
    return None


CONDENSER_FILE = "model.pt"
CONDENSER_PREFIX = "c_head."


def find_condenser_head_state(model_dir: str | Path | None, download: bool = False) -> dict[str, torch.Tensor] | None:
    """Condenser's extra layers from `<model_dir>/model.pt`, renamed to ExtraLayers' keys
    ("c_head.0.attention..." → "layers.0.attention..."); None when there is no such file or it holds
    no "c_head.*" tensors. `model_dir` is a directory or a hub name: its cached model.pt, or with
    `download` the hub's (loading the encoder by hub name never fetches model.pt)."""
    if model_dir is None or str(model_dir) == "":
        return None
    f = Path(model_dir) / CONDENSER_FILE
    if not Path(model_dir).is_dir():
        try:
            from transformers.utils import cached_file

            found = cached_file(
                str(model_dir),
                CONDENSER_FILE,
                local_files_only=not download,
                _raise_exceptions_for_missing_entries=False,
            )
        except Exception:  # not a hub name, not cached, or offline
            return None
        if not found:
            return None
        f = Path(found)
    if not f.is_file():
        return None
    state = torch.load(f, map_location="cpu", weights_only=True)
    out = {"layers." + k[len(CONDENSER_PREFIX) :]: v for k, v in state.items() if k.startswith(CONDENSER_PREFIX)}
    return out or None


def _local_dir(name_or_path: str | Path | None) -> Path | None:
    """A model directory: the path itself, or a hub name's snapshot already in the local cache."""
    if name_or_path is None or str(name_or_path) == "":
        return None
    if Path(name_or_path).is_dir():
        return Path(name_or_path)
    try:
        from transformers.utils import cached_file

        found = cached_file(
            str(name_or_path), "config.json", local_files_only=True, _raise_exceptions_for_missing_entries=False
        )
    except Exception:  # not a hub name, or not cached: the head is initialised afresh
        return None
    return Path(found).parent if found else None


class ExtraLayers(nn.Module):
    """The auxiliary network's additional transformer layers over C = [h ; M>0] (InfoCSE §3.1).

    Built as copies of the encoder's own top layers, so any BERT/RoBERTa-style encoder works;
    `init="random"` then re-initialises them as Condenser does for its head layers (the paper
    pre-trains the auxiliary network following Condenser), `init="top"` keeps the encoder's top
    layers' weights (the paper's "w/o pre-training" ablation, Table 4, uses BERT's upper layers).
    """

    def __init__(self, transformer: nn.Module, num_layers: int = 2, init: str = "random"):
        super().__init__()
        if init not in ("random", "top"):
            raise ValueError(f"extra_layers_init must be 'random' or 'top', not {init!r}")
        layers = transformer.encoder.layer
        if num_layers > len(layers):
            raise ValueError(f"{num_layers} extra layers asked for, the encoder has only {len(layers)} to copy")
        self.config = transformer.config
        self.layers = nn.ModuleList(copy.deepcopy(layers[len(layers) - num_layers :]))
        for p in self.layers.parameters():
            p.requires_grad_(True)
        if init == "random":
            init_bert_weights(self.layers, getattr(self.config, "initializer_range", 0.02))

    def load_condenser(self, state: dict[str, torch.Tensor]) -> None:
        """Take Condenser's c_head weights (from `find_condenser_head_state`): every tensor of every
        layer, and as many layers as this module has, or a ValueError naming the mismatch."""
        n = len({k.split(".")[1] for k in state})
        if n != len(self.layers):
            raise ValueError(
                f"the Condenser checkpoint has {n} head layers, InfoCSE has num_extra_layers={len(self.layers)}"
            )
        missing, unexpected = self.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ValueError(f"Condenser head does not fit the extra layers: missing {missing}, extra {unexpected}")

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        mask = create_bidirectional_mask(config=self.config, inputs_embeds=hidden, attention_mask=attention_mask)
        for layer in self.layers:
            out = layer(hidden, mask)
            hidden = out[0] if isinstance(out, tuple) else out
        return hidden


def frozen_lower_copy(transformer: nn.Module, num_layers: int) -> nn.Module:
    """Stage 2's separate copy of the embeddings + lower `num_layers` layers, all frozen (§3.2)."""
    lower = copy.deepcopy(transformer)
    lower.encoder.layer = lower.encoder.layer[:num_layers]
    lower.config.num_hidden_layers = num_layers
    lower.requires_grad_(False)
    return lower
