"""A SentenceEncoder or CrossEncoder to a servable directory: model.onnx + tokenizer + manifest.json.

The graph holds the whole embedding path (transformer, pooling, head, L2 normalisation), so the
service only tokenises and runs it. A CrossEncoder (CoSENT Eq. 11) or a Hugging Face reranker (PairScorer:
a *ForSequenceClassification with one label) exports instead as a graph from the tokenised pair to one score
per pair, its manifest's kind "cross-encoder" (served at /rerank); a PairScorer with several labels as a
classifier, every label's logit per text or pair (kind "classifier", served at /predict).
Every export is checked against torch on padded batches of mixed lengths before the manifest is
written: a directory with a manifest is a verified export.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import logging
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from core import families
from core.cross_encoder import CrossEncoder, PairScorer
from core.data import find_source_dir, read_stsb
from core.encoder import SentenceEncoder
from export import calibration, quantize
from service.manifest import (
    CLASSIFIER,
    CROSS_ENCODER,
    GRAPH_FILE,
    SCORE_OUTPUT,
    TOKEN_OUTPUT,
    Manifest,
    sha256_file,
)

log = logging.getLogger("sembed.export")

OPSET = 17
OUTPUTS = ["embedding", "embedding_raw"]  # L2-normalised, and as pooled (for normalize=false)
#: ... and the transformer's last hidden state of every token (TEI's /embed_all), asked for only by its passes
GRAPH_OUTPUTS = [*OUTPUTS, TOKEN_OUTPUT]
PARITY_TOLERANCE = 1e-4
PARITY_SENTENCES = [
    "A man is playing a guitar.",
    "Hi",
    "The quick brown fox jumps over the lazy dog while the farmer, who had seen it all before, "
    "kept on ploughing his field under a grey November sky.",
    "Stocks fell sharply on Monday.",
    "naïve café déjà-vu — unicode survives tokenisation?",
    " ".join(["long"] * 600),  # longer than any max_seq_length: exercises truncation
]


#: served again at start-up and compared with the vectors recorded here (service/backends/onnx.py)
GOLDEN_SENTENCES = ["A man is playing a guitar.", "A person plays the guitar.", "Stocks fell sharply on Monday."]


def golden_record(encoder: SentenceEncoder) -> dict[str, Any]:
    with torch.no_grad():
        vectors = _ExportGraph(encoder).eval()(**_feeds(encoder, GOLDEN_SENTENCES))[0].numpy()
    return {"sentences": GOLDEN_SENTENCES, "embeddings": np.round(vectors.astype(np.float64), 7).tolist()}


class ParityError(RuntimeError):
    pass


class _ExportGraph(nn.Module):
    def __init__(self, encoder: SentenceEncoder):
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        # the transformer's output as the encoder's own forward gets it (a hook: one forward, whatever pools it)
        seen: list[torch.Tensor] = []
        hook = self.encoder.transformer.register_forward_hook(lambda _m, _i, out: seen.append(out.last_hidden_state))
        try:
            raw = self.encoder(input_ids, attention_mask, token_type_ids)
        finally:
            hook.remove()
        return nn.functional.normalize(raw, p=2, dim=-1), raw, seen[-1]


def _input_names(encoder: SentenceEncoder | CrossEncoder | PairScorer) -> list[str]:
    names = ["input_ids", "attention_mask"]
    return names + ["token_type_ids"] if encoder.uses_token_type_ids else names


def _feeds(encoder: SentenceEncoder, texts: list[str], padding_side: str | None = None) -> dict[str, torch.Tensor]:
    """The texts tokenised as one padded batch: on the tokenizer's own side (sentence-transformers' way), or
    on `padding_side` ("right": the service's way; a decoder's tokenizer pads on the left)."""
    tokenizer = encoder.tokenizer
    own = tokenizer.padding_side
    tokenizer.padding_side = padding_side or own
    try:
        batch = encoder.tokenize(texts)
    finally:
        tokenizer.padding_side = own
    return {name: batch[name] for name in _input_names(encoder)}


def _fix_output_dims(graph_path: Path, dim: int, hidden: int = 0) -> None:
    """Tracing leaves the embedding axis symbolic; state it (and the token output's hidden axis), so clients can
    read dim from the graph."""
    import onnx

    model = onnx.load(str(graph_path))
    for output in model.graph.output:
        if output.name == TOKEN_OUTPUT:  # [batch, sequence, hidden]
            if hidden:
                output.type.tensor_type.shape.dim[2].dim_value = hidden
        else:
            output.type.tensor_type.shape.dim[1].dim_value = dim
    onnx.checker.check_model(model)
    onnx.save(model, str(graph_path))


def check_parity(encoder: SentenceEncoder, onnx_path: Path, texts: list[str] = PARITY_SENTENCES) -> float:
    """Max |onnx − torch| over every output on one padded batch of mixed lengths: torch on the batch padded
    as the model's tokenizer pads it, the graph on the batch padded on the right, as the service feeds it; the
    token output on each text's real tokens (wherever either side put its padding), relative to its largest
    state where that is over 1."""
    import onnxruntime as ort

    torch_feeds = _feeds(encoder, texts)
    with torch.no_grad():
        *expected, tokens = [t.numpy() for t in _ExportGraph(encoder).eval()(**torch_feeds)]
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    feeds = {k: v.numpy().astype(np.int64) for k, v in _feeds(encoder, texts, "right").items()}
    *got, got_tokens = session.run(GRAPH_OUTPUTS, feeds)
    diffs = [np.abs(g - e).max() for g, e in zip(got, expected)]
    torch_mask, graph_mask = torch_feeds["attention_mask"].numpy().astype(bool), feeds["attention_mask"].astype(bool)
    for i in range(len(texts)):
        # relative to the text's largest state where that is over 1: hidden states are not normalised, and a model's
        # outlier dimensions (tens or hundreds) carry float32 rounding of their own size
        expected_tokens = tokens[i][torch_mask[i]]
        scale = max(1.0, float(np.abs(expected_tokens).max()))
        diffs.append(np.abs(got_tokens[i][graph_mask[i]] - expected_tokens).max() / scale)
    return float(max(diffs))


def export_onnx(
    encoder: SentenceEncoder | CrossEncoder | PairScorer,
    out_dir: str | Path,
    *,
    name: str | None = None,
    method: str | None = None,
    training: dict[str, Any] | None = None,
    tolerance: float = PARITY_TOLERANCE,
    int8: bool = True,
    fp16: bool = True,
    data_dir: str | Path | None = None,
    max_stsb_drop: float = quantize.MAX_STSB_DROP,
    min_cosine: float = quantize.MIN_MEAN_COSINE,
) -> Manifest:
    """Write the export directory atomically: a failed parity check leaves nothing behind.

    A CrossEncoder or PairScorer exports as a pair scorer or classifier (`_export_cross_encoder`). Beside an embedding
    model's fp32 graph, int8 and fp16 variants (export/quantize.py) with their measured quality: one
    whose mean cosine to fp32 is under `min_cosine` on the short sentences or on the long passages, or,
    given a `data_dir` holding STS-B dev, that loses more than `max_stsb_drop` Spearman points, is left out;
    so is one whose building or measuring fails for any reason. The manifest's `variants` lists the graphs
    written, its `variants_left_out` the others asked for, each with why; the fp32 graph is always written.
    """
    out_dir = Path(out_dir)
    if isinstance(encoder, CrossEncoder | PairScorer):
        return _export_cross_encoder(encoder, out_dir, name=name, method=method, training=training,
                                     tolerance=tolerance)
    encoder = encoder.to("cpu").eval()
    input_names = _input_names(encoder)
    with _staged(out_dir) as staging:
        graph_path = staging / GRAPH_FILE
        _trace(_ExportGraph(encoder), _feeds(encoder, ["a short one", "a somewhat longer sentence to force padding"]),
               input_names, GRAPH_OUTPUTS, graph_path)
        _fix_output_dims(graph_path, encoder.dim, getattr(encoder.transformer.config, "hidden_size", 0))
        diff = check_parity(encoder, graph_path)
        if not diff <= tolerance:
            raise ParityError(f"ONNX and torch differ by {diff:.2e} (> {tolerance:.0e}); export discarded")
        _save_tokenizer(encoder.tokenizer, staging)
        manifest = Manifest(
            **_graph_fields(graph_path, encoder.tokenizer, input_names, GRAPH_OUTPUTS, diff),
            name=name or out_dir.name,
            base_model=encoder.base_model,
            method=method,
            pooling=encoder.pooling,
            dimension=encoder.dim,
            max_seq_length=encoder.max_seq_length,
            token_dimension=getattr(encoder.transformer.config, "hidden_size", 0),
            golden=golden_record(encoder),
            training=training,
            # what SentenceTransformer.encode returns by default for the source directory (the graph has both)
            normalize=encoder.normalize,
            prompts=encoder.prompts,
            default_prompt_name=encoder.default_prompt_name,
            family=families.family_of(encoder.transformer.config).name,
        )
        manifest.save(staging)
        manifest.variants = {"fp32": {"file": GRAPH_FILE, "sha256": manifest.onnx_sha256}}
        kept, left_out = _variants(encoder, staging, data_dir, max_stsb_drop, min_cosine, int8, fp16)
        manifest.variants.update(kept)
        # variant → why it is not in `variants` (an extra field: manifests without it load as before)
        manifest.variants_left_out = left_out
        manifest.calibration = calibration.calibrate(staging, data_dir)  # int8 / uint8 output's ranges
        manifest.save(staging)
    return manifest


@contextlib.contextmanager
def _staged(out_dir: Path):
    """A sibling folder to write into, renamed to `out_dir` only if the block succeeds."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    staging.chmod(0o755)  # mkdtemp's 0700 would hide the export from a non-root service user
    try:
        yield staging
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staging.rename(out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _trace(module: nn.Module, feeds: dict[str, torch.Tensor], input_names: list[str], output_names: list[str],
           graph_path: Path) -> None:
    dynamic_axes = {n: {0: "batch", 1: "sequence"} for n in input_names}
    dynamic_axes.update({n: {0: "batch", 1: "sequence"} if n == TOKEN_OUTPUT else {0: "batch"} for n in output_names})
    with torch.no_grad():
        torch.onnx.export(
            module,
            tuple(feeds[n] for n in input_names),
            str(graph_path),
            input_names=input_names,
            output_names=output_names,
            dynamic_axes=dynamic_axes,
            opset_version=OPSET,
            do_constant_folding=True,
            dynamo=False,  # the TorchScript exporter handles HF attention masks without onnxscript
        )


def _graph_fields(graph_path: Path, tokenizer, inputs: list[str], outputs: list[str], parity: float) -> dict[str, Any]:
    """The manifest fields that describe the verified graph, the same for every kind of export: its interface,
    opset and padding token, its sha256 and when it was written, and its parity check against torch."""
    return {"opset": OPSET, "pad_token": tokenizer.pad_token, "pad_token_id": tokenizer.pad_token_id,
            "inputs": inputs, "outputs": outputs, "onnx_sha256": sha256_file(graph_path),
            "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "parity_max_abs_diff": parity,
            "batch_invariant": True}  # pooling in the graph sums a batch of one row as it sums a larger batch


def _save_tokenizer(tokenizer, staging: Path) -> None:
    tokenizer.save_pretrained(staging)
    if not (staging / "tokenizer.json").is_file():
        raise ValueError("the export needs a fast tokenizer (tokenizer.json); this model has none")


# --- cross-encoder: one score per (query, text) pair, served at /rerank ----------------------------

#: mixed lengths, one pair past any max_seq_length (truncation, longest side first)
PARITY_PAIRS = [(PARITY_SENTENCES[i], PARITY_SENTENCES[j]) for i, j in ((0, 1), (1, 0), (2, 3), (4, 0), (5, 2), (3, 3))]
GOLDEN_PAIRS = [(GOLDEN_SENTENCES[0], GOLDEN_SENTENCES[1]), (GOLDEN_SENTENCES[0], GOLDEN_SENTENCES[2]),
                (GOLDEN_SENTENCES[2], GOLDEN_SENTENCES[1])]


class _ScoreGraph(nn.Module):
    def __init__(self, scorer: CrossEncoder | PairScorer):
        super().__init__()
        self.scorer = scorer

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        return self.scorer(input_ids, attention_mask, token_type_ids)


def _pair_feeds(scorer: CrossEncoder | PairScorer, pairs: list[tuple[str, str]]) -> dict[str, torch.Tensor]:
    batch = scorer.tokenize([a for a, _ in pairs], [b for _, b in pairs])
    return {name: batch[name] for name in _input_names(scorer)}


def check_pair_parity(scorer: CrossEncoder | PairScorer, onnx_path: Path,
                      pairs: list[tuple[str, str]] = PARITY_PAIRS) -> float:
    """Max |onnx − torch| of the scores of one padded batch of pairs of mixed lengths."""
    import onnxruntime as ort

    feeds = _pair_feeds(scorer, pairs)
    with torch.no_grad():
        expected = _ScoreGraph(scorer).eval()(**feeds).numpy()
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    (got,) = session.run([SCORE_OUTPUT], {k: v.numpy().astype(np.int64) for k, v in feeds.items()})
    return float(np.abs(got - expected).max())


def _export_cross_encoder(scorer: CrossEncoder | PairScorer, out_dir: Path, *, name: str | None, method: str | None,
                          training: dict[str, Any] | None, tolerance: float) -> Manifest:
    """The graph takes the tokenised pair (as the service's pair tokenisation gives it) and returns
    the logit f(i, j), [batch]; a classifier's graph (a PairScorer with several labels) every label's logit,
    [batch, labels], for single texts as for pairs. No int8 variant: its quality check measures embeddings."""
    scorer = scorer.to("cpu").eval()
    input_names = _input_names(scorer)
    with _staged(out_dir) as staging:
        graph_path = staging / GRAPH_FILE
        _trace(_ScoreGraph(scorer), _pair_feeds(scorer, PARITY_PAIRS[:2]), input_names, [SCORE_OUTPUT], graph_path)
        diff = check_pair_parity(scorer, graph_path)
        if not diff <= tolerance:
            raise ParityError(f"ONNX and torch scores differ by {diff:.2e} (> {tolerance:.0e}); export discarded")
        _save_tokenizer(scorer.tokenizer, staging)
        with torch.no_grad():
            golden = _ScoreGraph(scorer)(**_pair_feeds(scorer, GOLDEN_PAIRS)).numpy()
        labels = getattr(scorer, "labels", 1)
        manifest = Manifest(
            **_graph_fields(graph_path, scorer.tokenizer, input_names, [SCORE_OUTPUT], diff),
            name=name or out_dir.name,
            base_model=scorer.base_model,
            method=method,
            kind=CROSS_ENCODER if labels == 1 else CLASSIFIER,
            pooling="cls",  # the head reads the [CLS] state
            dimension=labels,
            max_seq_length=scorer.max_seq_length,
            golden={"pairs": [list(p) for p in GOLDEN_PAIRS],
                    "scores": np.round(golden.astype(np.float64), 7).tolist()},
            training=training,
            # what CrossEncoder.predict applies to the logit, and the service unless asked for raw scores
            score_activation=getattr(scorer, "activation", "Sigmoid"),
            id2label=scorer.id2label if labels > 1 else None,
            multi_label=labels > 1 and scorer.multi_label,
            family=families.family_of(scorer.transformer.config if isinstance(scorer, CrossEncoder)
                                      else scorer.model.config).name,
        )
        manifest.variants = {"fp32": {"file": GRAPH_FILE, "sha256": manifest.onnx_sha256}}
        manifest.save(staging)
    return manifest


def _variants(encoder: SentenceEncoder, staging: Path, data_dir, max_stsb_drop: float, min_cosine: float,
              int8: bool, fp16: bool) -> tuple[dict[str, Any], dict[str, str]]:
    """The int8 graph (one for every CPU: `quantize.build_int8`) and fp16 beside fp32, from one pass of
    transformer fusions, each with its quality measured here against fp32 (export/quantize.py), and the
    variants left out with why.

    Each variant stands alone: one that fails `quantize.check`, or whose building or measuring raises
    anything at all (a converter bug of one onnxruntime release, say), is left out with a warning, and the
    others and the verified fp32 graph are written all the same."""
    asked = (["int8"] if int8 else []) + (["fp16"] if fp16 else [])
    left_out: dict[str, str] = {}
    files = {"int8": quantize.INT8_FILE, "fp16": quantize.FP16_FILE}

    def leave_out(name: str, reason: str, error: Exception | None = None) -> None:
        left_out[name] = reason
        (staging / files[name]).unlink(missing_ok=True)
        print(f"{name} variant left out: {reason}", file=sys.stderr)
        # a traceback only for the unexpected: a refused quality gate says all there is in its reason
        log.warning("%s variant left out: %s", name, reason, exc_info=error)

    if not asked:
        return {}, left_out
    try:
        stsb_dev = _stsb_dev(data_dir)
        reference = quantize.Reference(staging, stsb_dev)
    except Exception as e:  # nothing to measure the variants against: none is built, none is kept unmeasured
        for name in asked:
            leave_out(name, f"measuring fp32's reference vectors failed ({_describe(e)})", e)
        return {}, left_out
    family = families.family_of(encoder.transformer.config)
    builders: dict[str, Callable[[Path, Path], dict[str, Any] | None]] = {}
    if "int8" in asked:  # what stays in float is searched per model against the cosine gate (quantize.search_int8)
        builders["int8"] = functools.partial(quantize.search_int8, export_dir=staging, min_cosine=min_cosine,
                                             reference=reference)
    if "fp16" in asked:
        builders["fp16"] = functools.partial(quantize.build_fp16, float32_norms=family.rms_norm)
    searched: dict[str, dict[str, Any] | None] = {}  # what a builder says of its choices (int8's float MatMuls)
    config = encoder.transformer.config
    plain, fused = staging / GRAPH_FILE, staging / ".fused.onnx"
    try:
        # onnxruntime's fusions where it has them for the family (0: the fuser reads heads and hidden size from
        # the graph, for a config that names them otherwise); a variant that cannot be built from the fused
        # graph is built from the plain one: fused or not, its quality is measured the same way below
        fusion = family.ort_fusion
        source = plain if fusion is None else quantize.fuse(
            plain, fused, getattr(config, "num_attention_heads", 0), getattr(config, "hidden_size", 0), fusion)
        for name, build in builders.items():
            try:
                try:
                    searched[name] = build(source, staging / files[name])
                except Exception as e:
                    if source == plain:
                        raise
                    log.warning("%s from the fused graph failed (%s): building it from the plain one", name, e)
                    searched[name] = build(plain, staging / files[name])
            except Exception as e:
                leave_out(name, f"building it failed ({_describe(e)})", e)
    finally:
        fused.unlink(missing_ok=True)
    built = [name for name in builders if name not in left_out]
    entries = {}
    for name in built:
        file = files[name]
        path = staging / file
        try:
            quality = quantize.measure(staging, file, stsb_dev, reference)
            if name == "fp16":
                float32_ops = quantize.cpu_float32_ops(path)
                quality.update(cpu_float32_ops=float32_ops, note=quantize.fp16_note(float32_ops))
            quantize.check(quality, max_stsb_drop, min_cosine, variant=name)
        except quantize.QualityError as e:
            leave_out(name, str(e))
            continue
        except Exception as e:
            leave_out(name, f"measuring it failed ({_describe(e)})", e)
            continue
        entries[name] = {"file": file, "sha256": sha256_file(path), "quality": quality,
                         **({"search": searched[name]} if searched.get(name) else {})}
    return entries, left_out


def _describe(error: Exception) -> str:
    return f"{type(error).__name__}: {error}".strip().rstrip(":")


def _stsb_dev(data_dir) -> list[tuple[str, str, float]] | None:
    """STS-B dev pairs wherever the training data readers find them under `data_dir`, or None."""
    if data_dir is None:
        return None
    try:
        stsb = find_source_dir("stsb", data_dir)
    except FileNotFoundError:
        return None
    return [(p.sentence1, p.sentence2, p.label) for p in read_stsb(stsb, "dev")]
