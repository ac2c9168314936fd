"""Token states to one vector per text: every pooling mode of sentence-transformers, in one module.

The modes and their arithmetic follow sentence-transformers' `Pooling` (and `WeightedLayerPooling`), so a
directory it loads embeds here as there; each is written in ops that trace into an ONNX graph, and
padding never counts, on whichever side it is (the service pads on the right, a decoder's tokenizer on the
left). A pooling is named by a string: one mode ("mean"), several concatenated in sentence-transformers'
order ("cls+mean"), or "first_last_avg" (SimCSE's average of the first and last layer, then mean).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

#: sentence-transformers' modes, in the order it concatenates them
MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
FIRST_LAST_AVG = "first_last_avg"
POOLINGS = (*MODES, FIRST_LAST_AVG)


def modes_of(pooling: str) -> tuple[str, ...]:
    """The modes a pooling name concatenates; ValueError naming the known ones for anything else."""
    if pooling == FIRST_LAST_AVG:
        return ("mean",)
    modes = tuple(pooling.split("+"))
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes or len(set(modes)) != len(modes):
        raise ValueError(f"unknown pooling {pooling!r}: one of {', '.join(POOLINGS)}, or modes joined by '+'")
    return tuple(m for m in MODES if m in modes)  # sentence-transformers' concatenation order


def name_of(modes: Sequence[str]) -> str:
    return "+".join(m for m in MODES if m in modes)


def _first_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """Each row's first real token ([B]): 0 with right padding. int32: onnxruntime's ArgMax takes no int64."""
    return attention_mask.to(torch.int32).argmax(dim=1)


def pool(pooling: str, token_embeddings: torch.Tensor, attention_mask: torch.Tensor,
         hidden_states: tuple[torch.Tensor, ...] | None = None,
         layer_weights: LayerWeights | None = None) -> torch.Tensor:
    """[B, T, H] token states (and every layer's, for a layer pooling) to [B, H × modes]."""
    if pooling == FIRST_LAST_AVG:
        layer_weights = LayerWeights.first_last(len(hidden_states) - 1 if hidden_states else 0)
    if layer_weights is not None:
        if hidden_states is None:
            raise ValueError(f"{pooling} pooling over weighted layers needs the transformer's hidden states")
        token_embeddings = layer_weights(hidden_states)
    mask = attention_mask.to(token_embeddings.dtype)
    out = []
    for mode in modes_of(pooling):
        if mode == "cls":  # the first real token
            index = _first_index(attention_mask)
            out.append(token_embeddings[torch.arange(token_embeddings.shape[0]), index])
        elif mode == "lasttoken":  # the last real token: a decoder's summary of the whole text
            last = token_embeddings.shape[1] - 1 - attention_mask.to(torch.int32).flip(1).argmax(dim=1)
            out.append(token_embeddings[torch.arange(token_embeddings.shape[0]), last])
        elif mode == "max":
            out.append(token_embeddings.masked_fill(mask.unsqueeze(-1) == 0, float("-inf")).max(dim=1).values)
        elif mode in ("mean", "mean_sqrt_len_tokens"):
            # A batched matmul, not sum(1): onnxruntime's ReduceSum adds in another order when the batch has
            # one row, so a text served alone would differ in the last bits from the same text in a batch.
            summed = torch.bmm(mask.unsqueeze(1), token_embeddings).squeeze(1)
            count = mask.sum(1, keepdim=True).clamp(min=1e-9)
            out.append(summed / (count if mode == "mean" else count.sqrt()))
        else:  # weightedmean: token i of the text (from 1) weighs i
            positions = torch.arange(1, token_embeddings.shape[1] + 1, dtype=token_embeddings.dtype)
            weights = mask * (positions.unsqueeze(0) - _first_index(attention_mask).unsqueeze(1).to(mask.dtype))
            summed = torch.bmm(weights.unsqueeze(1), token_embeddings).squeeze(1)
            out.append(summed / weights.sum(1, keepdim=True).clamp(min=1e-9))
    return out[0] if len(out) == 1 else torch.cat(out, dim=-1)


class LayerWeights(torch.nn.Module):
    """sentence-transformers' WeightedLayerPooling: Σ w_i · h_(start+i) / Σ w_i over the hidden states from
    layer `start` (0 is the embedding layer), which then stand in for the last layer's token states."""

    weights: torch.Tensor

    def __init__(self, start: int, weights: Sequence[float]):
        super().__init__()
        self.start = start
        self.register_buffer("weights", torch.tensor(list(weights), dtype=torch.float32))

    @classmethod
    def first_last(cls, layers: int) -> LayerWeights:
        """(h_1 + h_L) / 2, SimCSE's avg_first_last, as sentence-transformers saves it."""
        return cls(1, [1.0] + [0.0] * (layers - 2) + [1.0])

    @property
    def is_first_last(self) -> bool:
        w = self.weights.tolist()
        return self.start == 1 and len(w) >= 2 and w[0] == w[-1] != 0 and not any(w[1:-1])

    def forward(self, hidden_states: tuple[torch.Tensor, ...]) -> torch.Tensor:
        layers = hidden_states[self.start:]
        if len(layers) != len(self.weights):
            raise ValueError(f"layer pooling from layer {self.start} has {len(self.weights)} weights for "
                             f"{len(layers)} layers")
        if self.is_first_last:  # as SimCSE computes it: the same bits as before this class existed
            return (layers[0] + layers[-1]) / 2.0
        return sum(w * h for w, h in zip(self.weights, layers)) / self.weights.sum()
