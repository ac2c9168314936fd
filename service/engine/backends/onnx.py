"""onnxruntime + tokenizers over an export directory: the production backend (no torch)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from service.engine.backends.base import BackendError, bucketed_rows, pad_batch, padded_length
from service.hardware import physical_cores
from service.ipc.messages import ModelInfo, TokenBatch
from service.manifest import (
    CLASSIFIER,
    CROSS_ENCODER,
    EMBEDDING,
    GRAPH_FILE,
    SCORE_OUTPUT,
    SPARSE,
    SPARSE_OUTPUT,
    TOKEN_OUTPUT,
    Manifest,
    sha256_file,
)
from service.tokenization import Tokenizer

log = logging.getLogger("sembed.backend")

OUTPUTS = ["embedding", "embedding_raw"]


#: CUDA execution provider options that matter for throughput: the arena grows by what a pass asks for
#: (not doubling, which strands memory after one long pass), copies use the default stream (no
#: synchronisation between a pass's input copy and its kernels), TF32 matmuls (onnxruntime's default;
#: within the golden check's tolerance for another device).
CUDA_OPTIONS = {"arena_extend_strategy": "kSameAsRequested", "do_copy_in_default_stream": True, "use_tf32": True}

#: On CUDA a pass's row count is padded up to one of these (then to a multiple of the last): onnxruntime's CUDA
#: kernels pick and plan their algorithms once per input shape, so a load of single-text requests, each pass a new
#: row count, would pay that planning on pass after pass. Neighbours at most 1.5x apart bound the padding's waste;
#: the queue counts a pass's rows as padded, so its token budget bounds what the device computes.
CUDA_ROW_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)


#: streams on a CPU when SEMBED_STREAMS is 0: two passes at once, each on half the threads, get through more than
#: one on all of them (RESULTS.md, "Serving on a CPU"; measured on 2 cores: more streams than cores cannot be)
AUTO_STREAMS = 2


class IntegrityError(RuntimeError):
    pass


#: how far a served golden vector may be from the one recorded at export (parity is checked to 1e-4)
GOLDEN_TOLERANCE = 1e-3
#: ... when they were recorded on another device than the one serving: every export records them on its CPU,
#: and a GPU's kernels round differently (float16 ones more). Looser than that rounding, far tighter than how
#: far the variants' own vectors are from fp32's (their measured cosine: the manifest's `variants`), so a graph
#: or tokenizer that is not the recorded one still shows.
OTHER_DEVICE_GOLDEN_TOLERANCE = 5e-3

# (graph sha256, intra-op threads) → the multiple `calibrate_padding` found for it in this process: loading the same
# graph again (a reload of the same export, a copy of it with other prompts or another name) does not measure again
_CALIBRATED: dict[tuple[str, int], int] = {}


class OnnxBackend:
    """Runs model.onnx on padded batches; the graph itself pools, applies any head and normalises.

    Bit-for-bit batching: some of onnxruntime's CPU kernels (softmax over the sequence) take a
    different path for odd lengths, so a text's vector can depend on how far its batch is padded.
    Padding every batch to a multiple of a small number removes that; which number depends on the
    CPU's kernels, so `pad_to_multiple_of=0` measures it at start (`calibrate_padding`).

    A cross-encoder export (manifest kind "cross-encoder") takes tokenised (query, text) pairs and
    gives one score per row; `run` returns it as a [n, 1] array in both places of the pair. A sparse export
    (kind "sparse") gives each text's vocabulary-sized SPLADE vector, in both places too.

    An embedding graph exported with the token output (TEI's /embed_all) gives each token's last hidden state
    through `run_tokens`; `run` never asks for it, so onnxruntime never copies it out for /embed.
    """

    def __init__(self, export_dir: str | Path, *, device: str = "cpu", intra_op_threads: int = 0,
                 pad_to_multiple_of: int = 0, arena_keep_tokens: int = 8192, verify: bool = True,
                 variant: str = "fp32", graph_file: str | None = None, spin: bool = False, tensorrt: bool = False,
                 row_buckets: bool = True, streams: int = 1):
        import onnxruntime as ort

        export_dir = Path(export_dir)
        self._export_dir = export_dir
        self.manifest = Manifest.load(export_dir)  # an export in a retired layout is refused here (StaleExport)
        self.variant = variant
        entry = self._variant_entry(variant)
        graph = export_dir / (graph_file or entry["file"])
        if verify and graph_file is None:
            digest = sha256_file(graph)
            if digest != entry["sha256"]:
                raise IntegrityError(f"{graph} sha256 {digest} does not match manifest {entry['sha256']}")
        self._golden_embeddings = (self.manifest.golden or {}).get("embeddings") if variant == "fp32" else \
            entry.get("quality", {}).get("golden_embeddings")
        recorded_on = entry.get("quality", {}).get("measured_on", "cpu")  # fp32's: torch on the export's CPU
        self._golden_tolerance = GOLDEN_TOLERANCE if recorded_on == device else OTHER_DEVICE_GOLDEN_TOLERANCE
        self.scorer = self.manifest.kind in (CROSS_ENCODER, CLASSIFIER)  # a reranker's or classifier's scores
        self.sparse = self.manifest.kind == SPARSE  # a SPLADE vector per text
        self._outputs = [SCORE_OUTPUT] if self.scorer else [SPARSE_OUTPUT] if self.sparse else OUTPUTS

        max_len = self.manifest.max_seq_length
        self.tokenizer = Tokenizer(export_dir)  # for its own checks; requests arrive as token ids
        self.pad_id = self.manifest.pad_token_id
        self.pad_to_multiple_of = pad_to_multiple_of
        self._needs_type_ids = "token_type_ids" in self.manifest.inputs

        # Always an explicit count: left at 0, onnxruntime also pins each worker to a core, and the calling
        # thread (not pinned) can end up sharing a core with a spinning worker, slowing every pass for the life
        # of the process.
        threads = intra_op_threads or physical_cores()
        streams = streams or (1 if device == "cuda" else min(AUTO_STREAMS, threads))
        if device == "cuda" and streams > 1:
            raise ValueError(f"SEMBED_STREAMS={streams} on cuda: a GPU runs one pass at a time (streams are for CPUs)")
        if streams > threads:
            raise ValueError(f"SEMBED_STREAMS={streams} needs as many onnxruntime threads, one per stream at least; "
                             f"there are {threads} (SEMBED_INTRA_OP_THREADS, or the cores)")
        self.streams = streams
        options = self._options(threads, spin)
        available = ort.get_available_providers()
        if device == "cuda":
            if "CUDAExecutionProvider" not in available:
                raise RuntimeError(f"device=cuda but onnxruntime offers only {available}: "
                                   "install the gpu extra (onnxruntime-gpu) on a machine with CUDA")
            if hasattr(ort, "preload_dlls"):  # CUDA and cuDNN from the nvidia-* wheels, without importing torch
                ort.preload_dlls()
            providers = [("CUDAExecutionProvider", CUDA_OPTIONS), "CPUExecutionProvider"]
            if tensorrt:
                if "TensorrtExecutionProvider" not in available:
                    raise RuntimeError(f"tensorrt asked for but onnxruntime offers only {available}: install "
                                       "TensorRT's libraries where onnxruntime-gpu finds them")
                providers.insert(0, ("TensorrtExecutionProvider", {"trt_fp16_enable": variant == "fp16",
                                                                    "trt_engine_cache_enable": True,
                                                                    "trt_engine_cache_path": str(export_dir / ".trt")}))
        elif device == "cpu":
            providers = ["CPUExecutionProvider"]
        else:
            raise ValueError(f"unknown device {device!r}: cpu or cuda")
        if variant == "fp16" and device == "cpu":
            ops = entry.get("quality", {}).get("cpu_float32_ops")
            log.warning("serving the fp16 variant on the CPU: onnxruntime's CPU provider runs %s in float32 through "
                        "casts; the fp16 variant is meant for GPUs (SEMBED_DEVICE=cuda)",
                        ", ".join(ops) if ops else "most of its ops")
        self.device = device
        self.row_buckets: tuple[int, ...] = CUDA_ROW_BUCKETS if row_buckets and device == "cuda" else ()
        # onnxruntime quietly drops a provider its build lacks and, where one fails to load (TensorRT without
        # its libraries, CUDA without cuDNN), retries with the next ones: a service told to use the GPU must
        # not end up on the CPU, nor one asked for TensorRT on plain CUDA without its provider options
        self.session = ort.InferenceSession(str(graph), options, providers=providers, enable_fallback=0)
        # Streams: one more session, of threads/streams each, that every stream runs its passes on at once (its own
        # copy of the weights); `self.session`, on every thread, runs the wide passes and the in-process ones.
        self._narrow = None if streams == 1 else \
            ort.InferenceSession(str(graph), self._options(threads // streams, spin), providers=providers)
        running = self.session.get_providers()
        dropped = [name for name in (p if isinstance(p, str) else str(p[0]) for p in providers) if name not in running]
        if dropped:
            raise RuntimeError(f"onnxruntime did not load {', '.join(dropped)} (the session runs on "
                               f"{', '.join(running)}): check the GPU libraries (`make gpu-check`)")
        # The arena keeps the peak of the largest pass for the life of the process: after a pass larger
        # than `arena_keep_tokens` its free chunks go back. Not after every pass: re-faulting the
        # memory would slow every large pass (`python -m benchmarks.micro`; RESULTS.md).
        self.arena_keep_tokens = arena_keep_tokens
        self._run_keep = ort.RunOptions()
        self._run_shrink = ort.RunOptions()
        self._run_shrink.add_run_config_entry("memory.enable_memory_arena_shrinkage",
                                              "gpu:0" if device == "cuda" else "cpu:0")
        if not pad_to_multiple_of:
            # int8 quantises activations with one scale per batch, so its vectors move a little with their
            # batch neighbours whatever the padding: no multiple can make it exact, the least padding wins.
            int8 = variant == "int8"
            if device == "cuda":
                self.pad_to_multiple_of = 8
            elif int8:
                self.pad_to_multiple_of = 1
            elif verify and graph_file is None:  # the graph's digest, checked above, names what was calibrated
                key = (digest, options.intra_op_num_threads)
                if key not in _CALIBRATED:
                    _CALIBRATED[key] = self.calibrate_padding()
                self.pad_to_multiple_of = _CALIBRATED[key]
            else:
                self.pad_to_multiple_of = self.calibrate_padding()
        if self._narrow is not None and not self._streams_agree():
            log.warning("onnxruntime gives other bits on %d threads than on %d for the same texts: one pass at a time "
                        "(streams off), so a text's vector does not depend on the load", threads // streams, threads)
            self._narrow, self.streams = None, 1
        self.info = ModelInfo(model=self.manifest.name, dimension=self.manifest.dimension,
                                max_seq_length=max_len, device=device, variant=variant,
                                manifest=self.manifest.model_dump(mode="json"),
                                vocab_size=self.tokenizer.vocab_size, graph_sha256=entry["sha256"],
                                kind=self.manifest.kind, token_dimension=self._token_dimension())

    @staticmethod
    def _options(threads: int, spin: bool) -> Any:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = threads
        # Spinning: intra-op threads busy-wait between the parallel sections of a pass instead of sleeping
        # (a wake-up per section costs most on graphs of many small ops, as int8's); never between passes,
        # where the event loop needs the CPU.
        if spin:
            options.add_session_config_entry("session.force_spinning_stop", "1")
        else:
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        return options

    def _token_dimension(self) -> int:
        """The hidden size of the graph's token output, 0 where it has none (exported before /embed_all); the
        variants are built from the fp32 graph and keep its outputs."""
        manifest = self.manifest
        return manifest.token_dimension if manifest.kind == EMBEDDING and TOKEN_OUTPUT in manifest.outputs else 0

    def _variant_entry(self, variant: str) -> dict[str, Any]:
        variants = self.manifest.variants or {"fp32": {"file": GRAPH_FILE, "sha256": self.manifest.onnx_sha256}}
        if variant not in variants:
            raise ValueError(f"the export {self.manifest.name} has no {variant} variant; it has {sorted(variants)} "
                             "(re-export it, or set SEMBED_VARIANT to one of those)")
        return variants[variant]

    # --- the Backend interface --------------------------------------------------------------
    def run(self, batch: TokenBatch, seq_len: int, wide: bool = True) -> tuple[np.ndarray, np.ndarray]:
        session = self._session(wide)
        n = len(batch)
        rows = bucketed_rows(n, self.row_buckets)
        feeds = pad_batch(batch, seq_len, self.pad_id, rows)
        if not self._needs_type_ids:
            del feeds["token_type_ids"]
        options = self._run_shrink if rows * seq_len > self.arena_keep_tokens else self._run_keep
        try:
            if self.scorer or self.sparse:  # [rows] for a reranker, [rows, labels] for a classifier, [rows, vocab]
                (scores,) = self._run_cuda(feeds, options) if self.device == "cuda" else \
                    session.run(self._outputs, feeds, options)
                normalized = raw = scores.reshape(len(scores), -1)
            elif self.device == "cuda":
                normalized, raw = self._run_cuda(feeds, options)
            else:
                normalized, raw = session.run(self._outputs, feeds, options)
        except Exception as e:  # onnxruntime raises its own types; the engine needs one
            raise BackendError(f"onnxruntime failed on a batch of {n}×{seq_len}: {e}") from e
        return normalized[:n], raw[:n]

    def run_tokens(self, batch: TokenBatch, seq_len: int,
                   wide: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`run`, and every row's token states too, [n, seq_len, hidden] (padding positions included: the engine
        keeps each row's real tokens). Only for a graph with the token output (`info.token_dimension`)."""
        if not self.info.token_dimension:
            raise BackendError(f"the {self.variant} graph of {self.info.model} has no {TOKEN_OUTPUT} output")
        n = len(batch)
        rows = bucketed_rows(n, self.row_buckets)
        feeds = pad_batch(batch, seq_len, self.pad_id, rows)
        if not self._needs_type_ids:
            del feeds["token_type_ids"]
        options = self._run_shrink if rows * seq_len > self.arena_keep_tokens else self._run_keep
        outputs = [*OUTPUTS, TOKEN_OUTPUT]
        session = self._session(wide)
        try:
            normalized, raw, tokens = self._run_cuda(feeds, options, outputs) if self.device == "cuda" else \
                session.run(outputs, feeds, options)
        except Exception as e:
            raise BackendError(f"onnxruntime failed on a batch of {n}×{seq_len}: {e}") from e
        return normalized[:n], raw[:n], tokens[:n]

    def _session(self, wide: bool) -> Any:
        """Every thread's session (wide, or where there are no streams), else the streams' one."""
        return self.session if wide or self._narrow is None else self._narrow

    def _run_cuda(self, feeds: dict[str, np.ndarray], options: Any,
                  outputs: list[str] | None = None) -> list[np.ndarray]:
        # IO binding: inputs copied to the device once, outputs allocated there, no per-op host copies.
        binding = self.session.io_binding()
        for name, array in feeds.items():
            binding.bind_cpu_input(name, array)
        for name in outputs or self._outputs:
            binding.bind_output(name, "cuda")
        self.session.run_with_iobinding(binding, options)
        return [v.numpy() for v in binding.get_outputs()]

    def _probes(self) -> tuple[TokenBatch, TokenBatch]:
        """Texts of 1 to 63 words, and a longer one."""
        words = "the quick brown fox jumps over a lazy dog while rain falls on old city streets at night".split()
        probes = self._tokenize([" ".join(words[(i * 7 + j) % len(words)] for j in range(n)) for i, n in
                                enumerate(list(range(1, 21)) + [27, 33, 40, 63])])
        return probes, self._tokenize([" ".join(words * 5)])

    def _streams_agree(self) -> bool:
        """The stream session gives the wide one's bits (onnxruntime splits each op's work among its threads, not
        a sum: no rounding depends on their number; checked, as a kernel could)."""
        probes, _ = self._probes()
        batch = probes.take(np.array([0, 6, 19, len(probes) - 1]))  # 1, 7, 20 and 63 words: a pass of odd lengths
        seq_len = self._seq_len(batch)
        return all(np.array_equal(a, b) for a, b in zip(self.run(batch, seq_len), self.run(batch, seq_len, False)))

    def calibrate_padding(self, candidates: tuple[int, ...] = (1, 2, 4, 8, 16, 32)) -> int:
        """The smallest multiple for which probe texts give the same bits alone and in padded batches."""
        probes, longer = self._probes()
        for multiple in candidates:
            if all(self._same_bits(probes.slice(i, i + 1), longer, multiple) for i in range(len(probes))):
                log.info("padding batches to a multiple of %d keeps batching bit-exact on this CPU", multiple)
                return multiple
        log.warning("no padding multiple up to %d made batching bit-exact; using it anyway", candidates[-1])
        return candidates[-1]

    def _same_bits(self, item: TokenBatch, longer: TokenBatch, multiple: int) -> bool:
        own = padded_length(item.tokens, multiple)
        alone = self.run(item, own)[0][0]
        return (np.array_equal(alone, self.run(item, own + 2 * multiple)[0][0])
                and np.array_equal(alone, self.run(TokenBatch.concat([item, longer]),
                                                   padded_length(longer.tokens, multiple))[0][0]))

    def warmup(self, max_batch_tokens: int | None = None, max_batch_requests: int | None = None) -> None:
        """The first runs allocate and pick kernels: keep them off the first requests (on CUDA, every row
        bucket the queue can form at the lengths of short texts)."""
        if self.row_buckets:  # "the": one token, so with [CLS] and [SEP] 16 and 32 tokens
            most = bucketed_rows(max_batch_requests or self.row_buckets[-1], self.row_buckets)
            budget = max_batch_tokens or float("inf")
            batches = [["the " * (length - 2)] * n for n in self.row_buckets for length in (16, 32)
                       if n <= most and n * length <= budget]
        else:
            batches = [["warm-up " * words] * n for n, words in ((1, 16), (8, 64))]
        for texts in batches:
            batch = self._tokenize(texts)
            for wide in (True, False) if self._narrow is not None else (True,):
                self.run(batch, self._seq_len(batch), wide)

    def self_check(self) -> None:
        """Before the service is ready: the export's recorded sentences must come back as recorded.

        Catches what a sha256 cannot: a tokenizer.json from another model, a manifest edited by hand,
        an onnxruntime that computes differently. Also the shape and unit norms, and that the
        similarity ordering of the recorded vectors holds."""
        if self.scorer:
            return self._check_golden_scores()
        if self.sparse:
            return self._check_golden_sparse()
        golden = self.manifest.golden
        if not golden or not self._golden_embeddings:
            log.warning("%s records no golden vectors (exported before they existed): not checked", self.info.model)
            return
        expected = np.asarray(self._golden_embeddings, dtype=np.float32)
        got = self.encode(golden["sentences"], batch_size=len(golden["sentences"]))
        problems = []
        if got.shape != expected.shape or got.shape[1] != self.info.dimension:
            problems.append(f"shape {got.shape}, recorded {expected.shape}, manifest dimension {self.info.dimension}")
        else:
            if not np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-4):
                problems.append("embeddings are not unit length")
            diff = float(np.abs(got - expected).max())
            if diff > self._golden_tolerance:
                problems.append(f"golden vectors differ from the recorded ones by {diff:.2e} "
                                f"(more than {self._golden_tolerance:.0e})")
            ranked, recorded = np.argsort(got[1:] @ got[0]), np.argsort(expected[1:] @ expected[0])
            if not np.array_equal(ranked, recorded):
                problems.append("the similarity ordering of the golden sentences changed")
        if problems and self.variant == "int8":
            # int8 graphs with 8-bit weights (exported before sembed 0.5) compute differently on x86 CPUs with and
            # without VNNI (export/quantize.py, MAX_INT8_WEIGHT); the manifest does not say which weights it has
            problems.append("an int8 graph exported before sembed 0.5 computes differently on CPUs with and without "
                            f"VNNI: export again: {self.manifest.export_command(self._export_dir)}")
        if problems:
            raise IntegrityError(f"{self.info.model} ({self.variant}) failed its golden check: " + "; ".join(problems))

    def _check_golden_scores(self) -> None:
        golden = self.manifest.golden or {}
        if not golden.get("scores"):
            log.warning("%s records no golden scores: not checked", self.info.model)
            return
        expected = np.asarray(golden["scores"], dtype=np.float32)
        got = self.score_pairs([tuple(p) for p in golden["pairs"]], all_labels=True).reshape(expected.shape)
        problems = []
        diff = float(np.abs(got - expected).max())
        if diff > GOLDEN_TOLERANCE:
            problems.append(f"golden scores differ from the recorded ones by {diff:.2e}")
        if not np.array_equal(np.argsort(got, axis=0), np.argsort(expected, axis=0)):
            problems.append("the ordering of the golden pairs' scores changed")
        if problems:
            raise IntegrityError(f"{self.info.model} ({self.variant}) failed its golden check: " + "; ".join(problems))

    def _check_golden_sparse(self) -> None:
        """A sparse export records each golden sentence's largest values (export/sparse.py): they must come back."""
        golden = self.manifest.golden or {}
        if not golden.get("indices"):
            log.warning("%s records no golden vectors: not checked", self.info.model)
            return
        got = self.encode(golden["sentences"], batch_size=len(golden["sentences"]))
        indices = np.asarray(golden["indices"], dtype=np.int64)
        expected = np.asarray(golden["values"], dtype=np.float32)
        problems = []
        if got.shape[1] != self.info.dimension or indices.max() >= got.shape[1]:
            problems.append(f"vectors of {got.shape[1]} dimensions, manifest dimension {self.info.dimension}")
        else:
            diff = float(np.abs(np.take_along_axis(got, indices, axis=1) - expected).max())
            if diff > self._golden_tolerance:
                problems.append(f"golden values differ from the recorded ones by {diff:.2e}")
            if (got < 0).any():
                problems.append("a SPLADE vector has negative values")
        if problems:
            raise IntegrityError(f"{self.info.model} ({self.variant}) failed its golden check: " + "; ".join(problems))

    def health(self) -> None:
        batch = self._tokenize(["health check"])
        normalized, _ = self.run(batch, self._seq_len(batch))
        if not np.isfinite(normalized).all():
            raise BackendError("the health-check forward pass produced non-finite values")

    # --- in-process use (evaluation, tests): any number of texts --------------------------------
    def _tokenize(self, texts: list[str]) -> TokenBatch:
        return self.tokenizer.encode(texts)[0]

    def _seq_len(self, batch: TokenBatch) -> int:
        """What a pass of `batch` is padded to."""
        return padded_length(int(batch.lengths.max()), self.pad_to_multiple_of)

    def encode(self, texts: list[str], normalize: bool = True, batch_size: int = 64) -> np.ndarray:
        """Embed texts in length-sorted batches, rows in input order."""
        out = np.zeros((len(texts), self.info.dimension), dtype=np.float32)
        for rows, (normalized, raw) in self._in_passes(self._tokenize(list(texts)), batch_size):
            out[rows] = normalized if normalize else raw
        return out

    def score_pairs(self, pairs: list[tuple[str, str]], batch_size: int = 64, all_labels: bool = False) -> np.ndarray:
        """A cross-encoder's score of each (first, second) pair, [n], in length-sorted batches; with `all_labels`,
        every output of each pair, [n, dimension] (a classifier's logits)."""
        out = np.zeros((len(pairs), self.info.dimension), dtype=np.float32)
        for rows, (scores, _) in self._in_passes(self.tokenizer.encode_pairs(list(pairs))[0], batch_size):
            out[rows] = scores
        return out if all_labels else out[:, 0]

    def _in_passes(self, batch: TokenBatch,
                   batch_size: int) -> Iterator[tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]]:
        """Each length-sorted pass over `batch`: its rows' indices and what `run` gave for them."""
        order = np.argsort(-batch.lengths, kind="stable")
        for start in range(0, len(batch), batch_size):
            rows = order[start : start + batch_size]
            chunk = batch.take(rows)
            yield rows, self.run(chunk, self._seq_len(chunk))
