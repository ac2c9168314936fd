"""Single onnxruntime CPU ops timed alone: why the int8 graph spells the residual sum and GELU as it does.

Each case is a one- or two-op graph on a float32 batch of [32, 128, 384] (the residual stream) or
[32, 128, 1536] (the GELU's input), run with 1 and 2 intra-op threads, no spinning; median of `--runs`.
onnxruntime's own optimisations apply as when it loads an export (Add + LayerNormalization becomes
SkipLayerNormalization), except in the case that turns that fusion off. RESULTS.md (its int8 section) cites what
this printed.

    python -m benchmarks.onnx_ops [--threads 1,2] [--runs 30]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

from benchmarks import machine

BATCH, SEQ, HIDDEN, INNER = 32, 128, 384, 1536


def graphs() -> dict[str, tuple[bytes, int, list[str]]]:
    """name -> (model bytes, width of its inputs, optimisers to disable)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)

    def model(nodes, inputs, width, consts=()):
        inits = [numpy_helper.from_array(rng.normal(size=width).astype(np.float32), n) for n in consts]
        io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["b", "s", width]) for n in inputs]
        out = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
        m = helper.make_model(helper.make_graph(nodes, "op", io, out, inits), ir_version=8,
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
        return m.SerializeToString()

    def node(op, inputs, output="y", **attrs):
        domain = "com.microsoft" if op in ("SkipLayerNormalization", "FastGelu", "QuickGelu") or \
            (op == "Gelu" and not attrs) else ""
        return helper.make_node(op, inputs, [output], domain=domain, **attrs)

    ln = node("LayerNormalization", ["s", "gamma", "beta"], axis=-1, epsilon=1e-12)
    residual = ["x", "skip"]
    return {
        "Sum(x, bias, skip) + LayerNormalization": (model([node("Sum", ["x", "bias", "skip"], "s"), ln], residual,
                                                          HIDDEN, ("bias", "gamma", "beta")), HIDDEN, []),
        "Sum(x, bias, skip)": (model([node("Sum", ["x", "bias", "skip"])], residual, HIDDEN, ("bias",)), HIDDEN, []),
        "Sum(x, skip)": (model([node("Sum", residual)], residual, HIDDEN), HIDDEN, []),
        "Add(x, skip)": (model([node("Add", residual)], residual, HIDDEN), HIDDEN, []),
        "Sub(skip, x)": (model([node("Sub", ["skip", "x"])], residual, HIDDEN), HIDDEN, []),
        "LayerNormalization": (model([node("LayerNormalization", ["x", "gamma", "beta"], axis=-1, epsilon=1e-12)],
                                     ["x"], HIDDEN, ("gamma", "beta")), HIDDEN, []),
        "Add + LayerNormalization (loaded: SkipLayerNormalization)": (
            model([node("Add", residual, "s"), ln], residual, HIDDEN, ("gamma", "beta")), HIDDEN, []),
        "Add + LayerNormalization, that fusion off": (
            model([node("Add", residual, "s"), ln], residual, HIDDEN, ("gamma", "beta")), HIDDEN,
            ["SkipLayerNormFusion"]),
        "Sub + LayerNormalization": (model([node("Sub", ["skip", "x"], "s"), ln], residual, HIDDEN,
                                           ("gamma", "beta")), HIDDEN, []),
        "SkipLayerNormalization with bias": (
            model([node("SkipLayerNormalization", ["x", "skip", "gamma", "beta", "bias"], epsilon=1e-12)], residual,
                  HIDDEN, ("bias", "gamma", "beta")), HIDDEN, []),
        "Gelu (erf)": (model([node("Gelu", ["x"])], ["x"], INNER), INNER, []),
        "FastGelu (tanh)": (model([node("FastGelu", ["x"])], ["x"], INNER), INNER, []),
        "QuickGelu": (model([node("QuickGelu", ["x"], alpha=1.702)], ["x"], INNER), INNER, []),
    }


def time_ops(threads: int, runs: int) -> dict[str, float]:
    """Median milliseconds of each case with `threads` intra-op threads; the cases alternate within each run."""
    import onnxruntime as ort

    rng = np.random.default_rng(1)
    feeds = {w: {n: rng.standard_normal((BATCH, SEQ, w), dtype=np.float32) for n in ("x", "skip")}
             for w in (HIDDEN, INNER)}
    sessions = {}
    for name, (graph, width, disabled) in graphs().items():
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        session = ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"],
                                       disabled_optimizers=disabled)
        inputs = {i.name: feeds[width][i.name] for i in session.get_inputs()}
        session.run(None, inputs)  # warm-up
        sessions[name] = (session, inputs)
    times: dict[str, list[float]] = {name: [] for name in sessions}
    for _ in range(runs):
        for name, (session, inputs) in sessions.items():
            start = time.perf_counter()
            session.run(None, inputs)
            times[name].append(time.perf_counter() - start)
    return {name: 1000 * statistics.median(t) for name, t in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", default="1,2", help="intra-op thread counts")
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args(argv)
    counts = [int(t) for t in args.threads.split(",")]
    print(machine.cpu_line())
    print(f"[{BATCH}, {SEQ}, {HIDDEN}] float32 ([{BATCH}, {SEQ}, {INNER}] for the GELUs); "
          f"median ms of {args.runs} runs")
    results = {t: time_ops(t, args.runs) for t in counts}
    width = max(len(n) for n in results[counts[0]]) + 2
    print(f"{'op':<{width}}" + "".join(f"{f'{t} thread(s)':>14}" for t in counts))
    for name in results[counts[0]]:
        print(f"{name:<{width}}" + "".join(f"{results[t][name]:>14.2f}" for t in counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
