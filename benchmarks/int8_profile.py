"""Where an int8 pass spends its time, and whether this CPU's int8 kernels compute the exact products.

For each graph (the export's int8 variants, or `--graph` files, taking turns batch by batch in one process):
onnxruntime's profile (`SessionOptions.enable_profiling`) over length-sorted batches of 32 long texts (124-132
tokens, as `make bench` builds them), the first round a warm-up left out; kernel time per batch by op type (and
weight shape, for the ops with a constant weight: that time per million weights too). Then the largest difference
between the vectors of onnxruntime's default x86 int8 kernel and of its exact one
(`export.quantize.EXACT_INT8_KERNEL`), on the export's golden sentences and on the long texts: 0 where no uint8 x
int8 product saturates (VPMADDUBSW on x86 without VNNI; on a VNNI CPU both are the exact kernel).
RESULTS.md (its int8 section) cites what this printed.

    python -m benchmarks.int8_profile --model-dir models/all-MiniLM-L6-v2 --data-dir ../shared/data [--graph G ...]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks import machine
from benchmarks.int8_anchor import batches_of
from benchmarks.serving import make_texts
from export.quantize import EXACT_INT8_KERNEL


def session(graph: Path, threads: int = 0, profile_dir: Path | None = None, exact: bool = False):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    if profile_dir is not None:
        options.enable_profiling = True
        options.profile_file_prefix = str(profile_dir / "profile")
        # the graph as it runs (fused), to read each node's weight; onnxruntime warns that it is for this CPU only
        options.optimized_model_filepath = str(profile_dir / "optimized.onnx")
        options.log_severity_level = 3
    if exact:
        options.add_session_config_entry(EXACT_INT8_KERNEL, "1")
    return ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])


def weights_by_node(optimized: Path) -> dict[str, tuple[int, ...]]:
    """Each node's constant 2-D weight (its second input), by shape."""
    import onnx

    model = onnx.load(str(optimized), load_external_data=False)
    shapes = {init.name: tuple(init.dims) for init in model.graph.initializer}
    return {node.name: shapes[node.input[1]] for node in model.graph.node
            if len(node.input) > 1 and len(shapes.get(node.input[1], ())) == 2
            and int(np.prod(shapes[node.input[1]])) >= 4096}


Row = tuple[str, int, float, float | None]


def profile(graphs: list[Path], feeds: list[dict[str, np.ndarray]], threads: int = 1,
            rounds: int = 2) -> list[list[Row]]:
    """For each graph, (op, nodes, ms per batch, ms per batch and million weights), most time first; an op with a
    constant weight is one row per weight shape ("DynamicQuantizeMatMul 384x1536"). The graphs take turns batch by
    batch, in one process, so a neighbour's load or the clock moves all of them alike (profiled one after the other,
    one graph's total moved between runs by more than the graphs differed); the first round is a warm-up. With more
    than one thread a kernel's time is the wall time of its parallel section."""
    with tempfile.TemporaryDirectory(prefix="sembed-int8-profile-") as tmp:
        for i in range(len(graphs)):
            (Path(tmp) / str(i)).mkdir()
        sessions = [session(graph, threads=threads, profile_dir=Path(tmp) / str(i)) for i, graph in enumerate(graphs)]
        names = [{i.name for i in sess.get_inputs()} for sess in sessions]
        for _ in range(1 + rounds):
            for batch in feeds:
                for sess, inputs in zip(sessions, names):
                    sess.run(None, {k: v for k, v in batch.items() if k in inputs})
        return [_by_op(json.loads(Path(sess.end_profiling()).read_text()),
                       weights_by_node(Path(tmp) / str(i) / "optimized.onnx"), len(feeds))
                for i, sess in enumerate(sessions)]


def _by_op(events: list[dict], weights: dict[str, tuple[int, ...]], warm_up_runs: int) -> list[Row]:
    runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == "model_run")
    warm_up_end = runs[warm_up_runs - 1][1]
    time_us: dict[str, float] = collections.defaultdict(float)
    nodes: dict[str, set[str]] = collections.defaultdict(set)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] > warm_up_end:
            node = e["name"][: -len("_kernel_time")]
            shape = weights.get(node)
            op = e["args"]["op_name"] + (f" {shape[0]}x{shape[1]}" if shape else "")
            time_us[op] += e["dur"]
            nodes[op].add(node)
    measured = len(runs) - warm_up_runs
    rows: list[Row] = []
    for op, us in sorted(time_us.items(), key=lambda kv: -kv[1]):
        ms = us / 1000 / measured
        millions = sum(int(np.prod(weights.get(n, (0,)))) for n in nodes[op]) / 1e6
        rows.append((op, len(nodes[op]), ms, ms / millions if millions else None))
    return rows


def kernel_difference(graph: Path, feeds: list[dict[str, np.ndarray]]) -> float:
    """max |default kernel - exact kernel| over the vectors of `feeds` (the graph's first output)."""
    default, exact = session(graph), session(graph, exact=True)
    return max(float(np.abs(default.run(None, f)[0] - exact.run(None, f)[0]).max()) for f in feeds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, default=Path("models/all-MiniLM-L6-v2"), help="an export")
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    parser.add_argument("--graph", action="append", default=[], help="profile this graph file instead of the "
                        "export's int8 variants (repeatable)")
    parser.add_argument("--long", type=int, default=160, help="long texts, in batches of 32")
    parser.add_argument("--rounds", type=int, default=2, help="profiled passes over the texts (after one warm-up)")
    parser.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads (the service uses the "
                        "physical cores)")
    args = parser.parse_args(argv)

    from tokenizers import Tokenizer

    manifest = json.loads((args.model_dir / "manifest.json").read_text())
    tokenizer = Tokenizer.from_file(str(args.model_dir / "tokenizer.json"))
    tokenizer.no_padding()
    _, long = make_texts(tokenizer, args.data_dir, 0, args.long)
    tokenizer.enable_truncation(manifest["max_seq_length"])
    with_type_ids = "token_type_ids" in manifest["inputs"]
    feeds = batches_of(tokenizer, long, with_type_ids)
    golden = batches_of(tokenizer, (manifest.get("golden") or {}).get("sentences") or long[:3], with_type_ids)
    graphs = {g: Path(g) for g in args.graph} or {
        name: args.model_dir / entry["file"] for name, entry in (manifest.get("variants") or {}).items()
        if name.startswith("int8")}
    print(machine.cpu_line())
    print(f"{len(long)} long texts, batches of 32, {args.rounds} rounds profiled after a warm-up, the graphs taking "
          f"turns; {args.threads} thread(s)\n")
    if not graphs:
        print("no int8 graph: the export has no int8 variant and no --graph was given")
        return 1
    for (name, graph), rows in zip(graphs.items(), profile(list(graphs.values()), feeds, args.threads, args.rounds)):
        total = sum(ms for _, _, ms, _ in rows)
        print(f"{name} ({graph.name}): {total:.0f} ms per batch of 32")
        print(f"  {'op (weight shape)':<34}{'nodes':>6}{'ms/batch':>10}{'share':>8}{'ms per M weights':>18}")
        for op, n, ms, per_million in rows:
            print(f"  {op:<34}{n:>6}{ms:>10.1f}{ms / total:>8.1%}"
                  + (f"{per_million:>18.1f}" if per_million is not None else ""))
        print(f"  max |default int8 kernel - exact kernel|: golden sentences {kernel_difference(graph, golden):.1e}, "
              f"long texts {kernel_difference(graph, feeds):.1e}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
