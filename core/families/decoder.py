"""Decoder-only embedding models (Qwen3-Embedding, gte-Qwen2, e5-mistral): causal attention, so the text's
summary is its last token's state (sentence-transformers' "lasttoken" pooling), usually after an EOS the
tokenizer appends. Their tokenizers pad on the left; the graph finds the last real token from the
attention mask, so the service's right padding gives the same vectors (causal attention never lets a
real token read the padding after it, and rotary positions start at 0 for every row). onnxruntime's BERT
fusions do not apply (RMSNorm, rotary attention): the int8 and fp16 variants start from the plain graph."""

from __future__ import annotations

from core.families.base import Family

DECODER = Family("decoder", ("qwen2", "qwen3", "mistral", "llama", "gemma", "gemma2", "phi3", "qwen3_moe"),
                 default_pooling="lasttoken", ort_fusion=None, rms_norm=True)
