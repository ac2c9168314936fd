"""`make bench-int8`: our int8 variants against the int8 a user makes in one call with sentence-transformers.

The anchor is `sentence_transformers.export_dynamic_quantized_onnx_model(model, config)` with the config
that fits this CPU (`avx512_vnni` where it has VNNI, `arm64` on ARM, `avx2` otherwise), built by
`benchmarks/anchor_export.py` in its own environment (`.venv/anchor`: optimum-onnx pins transformers
< 4.58, which ours is past); nothing of it is needed to serve. Then, side by side in this one process:
our fp32, the anchor's int8 and every int8 variant of the export, on the same token ids (the export's
tokenizer), batches of 32 sorted by length, short (10-14 tokens) and long (124-132 tokens) texts as
`make bench` builds them; rounds alternate the contenders, each figure is the median of its rounds.
Ours run with the session options the service gives them; the anchor with onnxruntime's defaults, as
sentence-transformers' ONNX backend makes its session, plus its mean pooling and normalisation in numpy.
Quality: mean cosine to our fp32 on those texts, and the 7 STS tasks (`evaluation.sts`) for each.

    python -m benchmarks.int8_anchor --model-dir models/all-MiniLM-L6-v2 --data-dir ../shared/data \
        [--anchor-python .venv/anchor/bin/python] [--candidate NAME=graph.onnx ...] [--out results/bench-int8.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks import machine
from benchmarks.serving import BATCH, make_texts
from service.hardware import cpu_flags

#: what ours must reach against the anchor's int8 (issue 26)
MIN_SPEEDUP = 1.2
MIN_COSINE = 0.99
MAX_STS_DROP = 0.3
#: the name suffix of a contender run with onnxruntime's thread spinning off
NO_SPIN = ", no spinning"


# --- the anchor ----------------------------------------------------------------------------------
def anchor_config(flags: set[str], arch: str) -> str:
    """sentence-transformers' quantisation config for this CPU: its efficiency guide's three."""
    if arch.lower() in ("aarch64", "arm64") or arch.lower().startswith("arm"):
        return "arm64"
    if "avx512_vnni" in flags:
        return "avx512_vnni"
    return "avx2"


def build_anchor(st_dir: Path, config: str, out: Path, python: Path) -> Path:
    """The anchor's int8 graph (and its fp32 graph beside it) under `out`, built once per config. Its name
    carries the config's weight type: model_qint8_avx512_vnni.onnx, but model_quint8_avx2.onnx (optimum's
    avx2 config quantises weights to uint8)."""
    pattern = f"model_q*int8_{config}.onnx"
    if not any((out / "onnx").glob(pattern)):
        print(f"building the anchor ({config}) with {python} ...", flush=True)
        subprocess.run([str(python), "-m", "benchmarks.anchor_export", "--model", str(st_dir), "--config", config,
                        "--out", str(out)], check=True, cwd=Path(__file__).resolve().parent.parent)
    graphs = sorted((out / "onnx").glob(pattern))
    if len(graphs) != 1:
        raise SystemExit(f"expected one int8 graph of config {config} under {out / 'onnx'}, found {graphs}")
    return graphs[0]


# --- the contenders --------------------------------------------------------------------------------
def batches_of(tokenizer, texts: list[str], with_type_ids: bool) -> list[dict[str, np.ndarray]]:
    """Token ids in batches of BATCH, sorted by length, each padded to its longest text."""
    encodings = sorted(tokenizer.encode_batch(texts), key=lambda e: len(e.ids))
    out = []
    for start in range(0, len(encodings), BATCH):
        chunk = encodings[start : start + BATCH]
        width = max(len(e.ids) for e in chunk)
        ids = np.zeros((len(chunk), width), np.int64)
        mask = np.zeros_like(ids)
        for row, e in enumerate(chunk):
            ids[row, : len(e.ids)], mask[row, : len(e.ids)] = e.ids, 1
        feeds = {"input_ids": ids, "attention_mask": mask}
        if with_type_ids:
            feeds["token_type_ids"] = np.zeros_like(ids)
        out.append(feeds)
    return out


def ours(export_dir: Path, variant: str = "fp32", graph_file: str | None = None, spin: bool | None = None,
         threads: int = 0):
    """One of our graphs in the session the service makes for it (service.engine.backends.onnx, with the
    service's settings: threads unless given, spinning)."""
    from service.engine.backends.onnx import OnnxBackend
    from service.settings import Settings

    settings = Settings()
    backend = OnnxBackend(export_dir, variant=variant, graph_file=graph_file, verify=graph_file is None,
                          intra_op_threads=threads or settings.intra_op_threads,
                          spin=settings.intra_op_spinning if spin is None else spin)
    names = {i.name for i in backend.session.get_inputs()}
    return lambda feeds: backend.session.run(["embedding"], {k: v for k, v in feeds.items() if k in names})[0]


def anchor(graph: Path, spin: bool = True, threads: int = 0):
    """The anchor's graph as sentence-transformers runs it: a default onnxruntime session (`spin`=False: with
    the threads' spinning off, as ours can run; `threads`: as many as ours are given), then mean pooling over
    the attention mask and L2 normalisation of its token embeddings."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    if not spin:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}

    def encode(feeds):
        tokens = session.run(None, {k: v for k, v in feeds.items() if k in names})[0]
        mask = feeds["attention_mask"][:, :, None].astype(np.float32)
        pooled = (tokens * mask).sum(axis=1) / np.clip(mask.sum(axis=1), 1e-9, None)
        return pooled / np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)

    return encode


class Embedder:
    """`evaluation.sts`'s interface over a contender: the export's tokenizer, batches of BATCH."""

    def __init__(self, name: str, fn, tokenizer, with_type_ids: bool):
        self.name, self.fn, self.tokenizer, self.with_type_ids = name, fn, tokenizer, with_type_ids

    def encode(self, texts: list[str]) -> np.ndarray:
        order = np.argsort([len(e.ids) for e in self.tokenizer.encode_batch(texts)], kind="stable")
        out = np.concatenate([self.fn(f) for f in batches_of(self.tokenizer, [texts[i] for i in order],
                                                             self.with_type_ids)])
        result = np.empty_like(out)
        result[order] = out
        return result


def timed(fn, batches: list[dict[str, np.ndarray]], sentences: int) -> tuple[float, float]:
    """Sentences per second of wall-clock time, and per second of this process's CPU time (all its threads):
    on a CPU others share, the second moves far less with their load, but it counts a spinning thread's
    waiting as work, so it compares contenders run without spinning only."""
    wall, cpu = time.perf_counter(), time.process_time()
    for feeds in batches:
        fn(feeds)
    return sentences / (time.perf_counter() - wall), sentences / (time.process_time() - cpu)


# --- the run ---------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, default=Path("models/all-MiniLM-L6-v2"), help="our export")
    parser.add_argument("--st-model", type=Path, default=None,
                        help="sentence-transformers directory of the same model (default: the export's base model, "
                        "the embedded all-MiniLM-L6-v2 or all-mpnet-base-v2)")
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    parser.add_argument("--anchor-python", type=Path, default=Path(".venv/anchor/bin/python"),
                        help="the anchor's environment (make bench-int8 builds it)")
    parser.add_argument("--anchor-dir", type=Path, default=Path("models/anchor"),
                        help="where the anchor's graphs go (one folder per model and config)")
    parser.add_argument("--config", default=None, help="the anchor's config (default: the one that fits this CPU)")
    parser.add_argument("--candidate", action="append", default=[], metavar="NAME=GRAPH",
                        help="also measure this graph of ours in the service's session (GRAPH@nospin: without "
                        "spinning)")
    parser.add_argument("--short", type=int, default=640, help="short texts per pass")
    parser.add_argument("--long", type=int, default=128, help="long texts per pass")
    parser.add_argument("--rounds", type=int, default=7, help="alternating rounds (each figure: their median)")
    parser.add_argument("--no-sts", action="store_true", help="skip the 7-task STS of each contender")
    parser.add_argument("--threads", type=int, default=0,
                        help="intra-op threads of every contender, the anchor's too (default: the service's for "
                        "ours, onnxruntime's for the anchor), e.g. a many-core host's figure for a 2-core machine")
    parser.add_argument("--out", type=Path, default=None, help="also write the figures here as JSON")
    args = parser.parse_args(argv)

    from tokenizers import Tokenizer

    flags, arch = cpu_flags() or set(), platform.machine()
    config = args.config or anchor_config(flags, arch)
    print(machine.cpu_line(), flush=True)
    base_model = json.loads((args.model_dir / "manifest.json").read_text())["base_model"]
    st_dir = args.st_model
    if st_dir is None:  # the export's own base model where it is one of ours (the embedded default, all-mpnet-base-v2)
        from core.default_model import resolve_model

        st_dir = Path(resolve_model(base_model))
    # one folder per model and config: another model's anchor is never reused
    anchor_graph = build_anchor(st_dir, config, args.anchor_dir / Path(base_model).name / config, args.anchor_python)

    manifest = json.loads((args.model_dir / "manifest.json").read_text())
    tokenizer = Tokenizer.from_file(str(args.model_dir / "tokenizer.json"))
    tokenizer.no_padding()
    short, long = make_texts(tokenizer, args.data_dir, args.short, args.long)
    tokenizer.no_padding()
    tokenizer.enable_truncation(manifest["max_seq_length"])
    with_type_ids = "token_type_ids" in manifest["inputs"]
    texts = {"short": short, "long": long}
    feeds = {name: batches_of(tokenizer, t, with_type_ids) for name, t in texts.items()}
    shipped = [v for v in (manifest.get("variants") or {}) if v == "int8"]
    served = shipped[0] if shipped else None  # the one SEMBED_VARIANT=int8 serves: the targets are its
    print(f"anchor: export_dynamic_quantized_onnx_model(model, {config!r}) (this CPU: {arch}, "
          f"{'VNNI' if flags & {'avx512_vnni', 'avx_vnni'} else 'no VNNI'}); ours as served here: {served}")
    print(f"texts: {len(short)} short, {len(long)} long; batch {BATCH} sorted by length; {args.rounds} rounds, "
          f"median; intra-op threads: {args.threads or 'the service default (ours), onnxruntime default (anchor)'}\n",
          flush=True)

    # Spinning (threads busy-waiting within a pass) is onnxruntime's default and the service's, and wins on an
    # idle CPU; on a busy one it loses, and by more than the graphs differ: both sides are also run without it.
    anchor_name = f"anchor int8 ({config})"
    threads = args.threads
    contenders = {"fp32": ours(args.model_dir, threads=threads), anchor_name: anchor(anchor_graph, threads=threads),
                  f"{anchor_name}{NO_SPIN}": anchor(anchor_graph, spin=False, threads=threads)}
    for v in shipped:
        contenders[v] = ours(args.model_dir, variant=v, threads=threads)
        contenders[f"{v}{NO_SPIN}"] = ours(args.model_dir, variant=v, spin=False, threads=threads)
    for spec in args.candidate:
        name, _, graph = spec.partition("=")
        graph, _, option = graph.partition("@")  # GRAPH@nospin: without the service's spinning
        contenders[name + (NO_SPIN if option == "nospin" else "")] = ours(
            args.model_dir, variant="int8" if shipped else "fp32", graph_file=str(Path(graph).resolve()),
            spin=False if option == "nospin" else None, threads=threads)

    rates: dict[str, dict[str, list[float]]] = {n: {w: [] for w in contenders} for n in texts}
    cpu_rates: dict[str, dict[str, list[float]]] = {n: {w: [] for w in contenders} for n in texts}
    loads = [os.getloadavg()[0]]
    for name in texts:  # warm-up
        for fn in contenders.values():
            fn(feeds[name][-1])
    for r in range(args.rounds):
        for name, t in texts.items():
            order = list(contenders) if r % 2 == 0 else list(reversed(contenders))
            for who in order:
                wall, cpu = timed(contenders[who], feeds[name], len(t))
                rates[name][who].append(wall)
                cpu_rates[name][who].append(cpu)
        loads.append(os.getloadavg()[0])
    results: dict = {"cpu": machine.cpu_line(), "anchor_config": config, "load_averages": loads, "contenders": {}}
    reference = {name: np.concatenate([contenders["fp32"](f) for f in feeds[name]]) for name in texts}
    for who, fn in contenders.items():
        row: dict = {}
        for name in texts:
            got = np.concatenate([fn(f) for f in feeds[name]])
            row[name] = {"median": statistics.median(rates[name][who]), "rounds": rates[name][who],
                         "per_cpu_second": statistics.median(cpu_rates[name][who]),
                         "mean_cosine": float((got * reference[name]).sum(axis=1).mean())}
        results["contenders"][who] = row
    if not args.no_sts and (args.data_dir / "senteval").is_dir():
        from evaluation.sts import evaluate_sts

        print("7-task STS per contender ...", flush=True)
        for who, fn in contenders.items():
            if who.endswith(NO_SPIN):  # the same graph as its row with spinning: the same vectors
                continue
            results["contenders"][who]["sts"] = evaluate_sts(Embedder(who, fn, tokenizer, with_type_ids),
                                                             data_dir=args.data_dir)
    results["golden"] = {v: golden_check(args.model_dir, v) for v in shipped}
    report(results, anchor_name)
    checks = targets(results, anchor_name, [served] if served else [])
    print()
    if not shipped:
        print("n/a   int8 targets: this export has no int8 variant")
    return machine.finish(checks, results, args.out)


def golden_check(export_dir: Path, variant: str) -> str | None:
    """None if the variant passes the golden check the service runs at start-up, else why not."""
    from service.engine.backends.onnx import OnnxBackend

    try:
        OnnxBackend(export_dir, variant=variant).self_check()
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return None


def report(results: dict, anchor_name: str) -> None:
    rows = results["contenders"]
    sts = "sts" in rows["fp32"]
    width = max(len(w) for w in rows) + 2
    print(f"{'sentences/s':<{width}}{'short':>9}{'long':>9}{'/anchor short':>15}{'/anchor long':>14}"
          f"{'per CPU-s: short':>18}{'long':>7}{'/anchor':>9}{'/anchor':>9}"
          f"{'cos short':>11}{'cos long':>10}" + (f"{'STS avg':>9}{'drop':>7}" if sts else ""))
    for who, r in rows.items():
        line = f"{who:<{width}}"
        line += "".join(f"{r[n]['median']:>9.1f}" for n in ("short", "long"))
        base = rows[anchor_name + (NO_SPIN if who.endswith(NO_SPIN) else "")]  # like with like
        line += "".join(f"{r[n]['median'] / base[n]['median']:>{w}.2f}x" for n, w in (("short", 14), ("long", 13)))
        line += f"{r['short']['per_cpu_second']:>18.1f}{r['long']['per_cpu_second']:>7.1f}"
        line += "".join(f"{r[n]['per_cpu_second'] / base[n]['per_cpu_second']:>8.2f}x" for n in ("short", "long"))
        line += "".join(f"{r[n]['mean_cosine']:>{w}.4f}" for n, w in (("short", 11), ("long", 10)))
        if sts and "sts" in r:
            line += f"{r['sts']['avg']:>9.2f}{rows['fp32']['sts']['avg'] - r['sts']['avg']:>+7.2f}"
        print(line)
    loads = results["load_averages"]
    print(f"\nload average (1 min) during the rounds: {min(loads):.2f}-{max(loads):.2f}; per CPU-s: sentences per "
          "second of this process's CPU time, which counts spinning as work (compare the rows without it)")


def targets(results: dict, anchor_name: str, shipped: list[str]) -> list[tuple[str, bool]]:
    rows, checks = results["contenders"], []
    base = rows[anchor_name]
    for v in shipped:
        r = rows[v]
        for suffix, how in (("", "both spinning, as served"), (NO_SPIN, "both without spinning")):
            for n in ("short", "long"):
                ours_, theirs = rows[v + suffix][n], rows[anchor_name + suffix][n]
                ratio = ours_["median"] / theirs["median"]
                # the rounds' own ratios: the two ran seconds apart in each, where the host's speed drifts by
                # minutes; printed beside the verdict, which stays the ratio of the medians
                paired = statistics.median(a / b for a, b in zip(ours_["rounds"], theirs["rounds"]))
                checks.append((f"{v} ≥ {MIN_SPEEDUP}× the anchor's int8 ({results['anchor_config']}), {n}, {how} "
                               f"({ratio:.2f}×; median of the rounds' own ratios {paired:.2f}×)",
                               ratio >= MIN_SPEEDUP))
        for n in ("short", "long"):
            cos = r[n]["mean_cosine"]
            checks.append((f"{v} mean cosine to fp32 ≥ {MIN_COSINE}, {n} ({cos:.4f})", cos >= MIN_COSINE))
        if "sts" in r:
            drop = rows["fp32"]["sts"]["avg"] - r["sts"]["avg"]
            checks.append((f"{v} 7-task STS drop ≤ {MAX_STS_DROP} ({drop:+.2f}; anchor "
                           f"{rows['fp32']['sts']['avg'] - base['sts']['avg']:+.2f})", drop <= MAX_STS_DROP))
        why = results["golden"][v]
        checks.append((f"{v} passes the golden check" + (f" ({why})" if why else ""), why is None))
    return checks


if __name__ == "__main__":
    sys.exit(main())
