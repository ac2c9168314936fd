"""Gemma 3 as EmbeddingGemma uses it: Gemma3TextModel with bidirectional attention (the config's
use_bidirectional_attention), mean pooling and Dense heads in its sentence-transformers modules.

transformers builds its bidirectional masks with torch.vmap over a mask function, which the ONNX tracer
cannot follow; `prepare` hands the model the same two masks built from the 2-D attention mask with
broadcasting instead (transformers takes a dict of prepared masks as they are): full attention sees every
real token, sliding-window attention every real token less than `sliding_window` positions away.
"""

from __future__ import annotations

import functools

import torch

from core.families.base import Family


def bidirectional_masks(attention_mask: torch.Tensor, sliding_window: int, attn_implementation: str,
                        dtype: torch.dtype) -> dict[str, torch.Tensor]:
    real = attention_mask.bool()[:, None, None, :]  # [B, 1, 1, kv]
    positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    near = (positions[:, None] - positions[None, :]).abs() < sliding_window  # [q, kv]
    full = real.expand(-1, -1, attention_mask.shape[1], -1)
    masks = {"full_attention": full, "sliding_attention": full & near}
    if attn_implementation == "eager":  # additive: 0 where seen, the dtype's minimum where not
        low = torch.finfo(dtype).min
        return {k: torch.zeros((), dtype=dtype).masked_fill(~m, low) for k, m in masks.items()}
    return masks


class _Gemma3(Family):
    def prepare(self, model) -> None:
        config = model.config
        if not getattr(config, "use_bidirectional_attention", False):
            return
        forward = model.forward

        @functools.wraps(forward)
        def bidirectional_forward(*args, attention_mask=None, **kwargs):
            if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2:
                attention_mask = bidirectional_masks(attention_mask, config.sliding_window,
                                                     config._attn_implementation, model.dtype)
            return forward(*args, attention_mask=attention_mask, **kwargs)

        model.forward = bidirectional_forward


GEMMA3 = _Gemma3("gemma3", ("gemma3_text",), ort_fusion=None, rms_norm=True)  # BERT's fusions do not apply
