"""The int8 and fp16 variants of an export, built from onnxruntime's transformer fusions.

Fusions first (attention, LayerNorm, GELU: `onnxruntime.transformers.optimizer`), once for both:
- int8: dynamic quantisation, weights per output channel, activations at run time, of every MatMul
  and the fused attention (but those a model needs in float to pass the gate: `search_int8`), the
  feed-forward outputs of layers 0-2 with their inputs scaled per row first; two
  fusions that the CPU provider runs slowly split back (`build_int8` says which and why). One graph that
  computes the same vectors on every x86 CPU (exports with the retired per-CPU pair, int8 by blocks beside
  int8-avx2, are refused by the service: service/manifest.py);
- fp16: weights and activations in float16 for GPUs, inputs and outputs unchanged (int64 in, float32
  out), pooling and L2 normalisation kept in float32 (`build_fp16`).
Each variant's quality is measured against the fp32 graph the export just verified: cosine on a fixed
set of short sentences and one of long passages, and, given STS-B dev, the Spearman delta; `check`
refuses a variant under `MIN_MEAN_COSINE` on either set or past `MAX_STSB_DROP` points.
"""

from __future__ import annotations

import functools
import logging
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("sembed.export")

INT8_FILE = "model.int8.onnx"
FP16_FILE = "model.fp16.onnx"
#: the export keeps no variant that loses more STS-B dev Spearman (× 100) than this
MAX_STSB_DROP = 0.5
#: ... nor one whose mean cosine to fp32 is below this on the short sentences or on the long passages
MIN_MEAN_COSINE = 0.99
#: the quality sets in export/data/, one text a line, shipped with the package (pyproject.toml's package data):
#: short sentences, and long texts, since int8 loses more on long texts than on short ones: 16 prose passages, then
#: 16 texts joined from unrelated short sentences, as `benchmarks/serving.py` joins WordNet glosses into its long
#: texts, so that int8's cosine on them tracks the one make bench measures (compared when they were chosen: e20bfbf)
QUALITY_SHORT_FILE, QUALITY_LONG_FILE = "quality_short.txt", "quality_long.txt"


@functools.cache
def _texts(name: str) -> tuple[str, ...]:
    return tuple((resources.files("export") / "data" / name).read_text(encoding="utf-8").splitlines())


def quality_sentences() -> list[str]:
    """The short sentences every variant's cosine to fp32 is measured on."""
    return list(_texts(QUALITY_SHORT_FILE))


def quality_long_sentences() -> list[str]:
    """The long passages every variant's cosine to fp32 is measured on."""
    return list(_texts(QUALITY_LONG_FILE))


class QualityError(RuntimeError):
    pass


def fuse(fp32_graph: Path, out: Path, num_heads: int, hidden_size: int, model_type: str = "bert") -> Path:
    """onnxruntime's fusions for `model_type` (BERT's: Attention, SkipLayerNormalization, BiasGelu,
    EmbedLayerNormalization) written to `out`; the plain graph when the fuser does not know the architecture."""
    try:
        from onnxruntime.transformers.optimizer import optimize_model

        optimize_model(str(fp32_graph), model_type=model_type, num_heads=num_heads, hidden_size=hidden_size,
                       opt_level=1).save_model_to_file(str(out))
        return out
    except Exception as e:
        log.warning("transformer fusions failed (%s); building the variants from the unfused graph", e)
        return fp32_graph


#: the layers (counted from the input) whose feed-forward output MatMul `build_int8` row-scales (`row_scaled`)
ROW_SCALED_LAYERS = (0, 1, 2)


def build_int8(source: Path, out: Path, layers: tuple[int, ...] = ROW_SCALED_LAYERS,
               float_nodes: tuple[str, ...] = ()) -> None:
    """int8 of `source` (the fused graph): one graph for every CPU, each choice measured against the int8
    sentence-transformers makes in one call (`make bench-int8`; RESULTS.md "int8 against sentence-transformers'
    one-call int8"; docs/int8.md):

    - dynamic quantisation: weights per output channel, symmetric int8 in 7 bits (`reduce_range`, |q| <= 64);
      activations uint8 with one scale per tensor, computed per pass at run time; the fused attention's QKV
      projection (QAttention) and the embedding tables (QEmbedLayerNormalization) quantised too. 7 bits
      because x86 CPUs without VNNI multiply uint8 by int8 with VPMADDUBSW, which saturates each pair of
      products at 32,767: with 8-bit weights (255 * 127 * 2) an AVX2-only CPU's vectors differ from the exact
      ones a VNNI CPU computes (`EXACT_INT8_KERNEL`), so an export made on one failed its golden check on the
      other; with 7 bits (255 * 64 * 2 = 32,640) every x86 kernel is exact and gives the same vectors
      (`saturating_int8_weights`), at a small cost in cosine and none in speed (the same kernels);
    - the feed-forward output MatMuls of `layers` row-scaled first (`row_scaled`): they take the GELU's
      long-tailed output, which one uint8 scale per tensor resolves worst, and an early layer's error runs
      through every later one (all quantised plainly per tensor, long texts fall under the gate). Each row
      (token) of their input scaled to a largest |value| of 1 lets the one scale per tensor fit every token,
      with no float32 or per-block GEMM (MatMulNBits' kernels compute differently per instruction set);
    - the fused ops onnxruntime's CPU provider runs slowly split back into the plain ops it runs fast:
      SkipLayerNormalization (`plain_layer_norms`: the same values) and BiasGelu (`plain_gelu`, with GELU's tanh
      approximation). Not fusions left undone: `fuse` serves fp16 too, which keeps them, and the int8 rewrites
      depend on the int8 GEMMs before them (a negated GEMM and a Sub where onnxruntime would fuse an Add back).
    Quantising every MatMul per tensor, the unfused graph with int8 attention products (sentence-transformers'
    graph), static QDQ, symmetric activations, asymmetric weights and per-tensor weights all lose the cosine
    gate or more (`python -m benchmarks.int8_configs`).
    `float_nodes`: MatMuls left in float32 (what `search_int8` finds a model needs to pass the gate)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = onnx.load(str(source))
    row_scaled(model, {name for i, name in enumerate(ffn_outputs(model.graph)) if i in layers})
    quantize_dynamic(model, str(out), per_channel=True, reduce_range=True, weight_type=QuantType.QInt8,
                     nodes_to_exclude=list(float_nodes), extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    model = onnx.load(str(out))
    if saturating := saturating_int8_weights(model):  # another onnxruntime's quantiser, say: refuse, named
        raise ValueError(f"int8 weights past ±{MAX_INT8_WEIGHT} would saturate x86 CPUs without VNNI: {saturating}")
    plain_gelu(model)
    plain_layer_norms(model)
    onnx.save(model, str(out))
    onnx.checker.check_model(str(out))


def local_int8_errors(source: Path, export_dir: Path, texts: list[str],
                      row_scaled_nodes: set[str] = frozenset()) -> dict[str, float]:
    """Each constant-weight MatMul of `source`'s relative error ‖x̂Ŵ − xW‖ / ‖xW‖ (per token, averaged) when only
    it is quantised as `build_int8` quantises it (its input uint8 with one scale per tensor, rows scaled to 1 first
    where it is row-scaled; its weight per output channel, 7 bits), on the float graph's own activations for
    `texts` tokenised and padded as one batch as the service does: how much each GEMM loses by itself, from one run
    of the float graph."""
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    from service.engine.backends.base import pad_batch
    from service.manifest import Manifest
    from service.tokenization import Tokenizer

    model = onnx.load(str(source))
    weights = {init.name: init for init in model.graph.initializer}
    nodes = [n for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in weights
             and len(weights[n.input[1]].dims) == 2]
    known = {o.name for o in model.graph.output}
    for name in dict.fromkeys(n.input[0] for n in nodes):
        if name not in known:
            model.graph.output.append(onnx.ValueInfoProto(name=name))
    manifest = Manifest.load(export_dir)
    batch = Tokenizer(export_dir).encode(texts)[0]  # as the service tokenises and pads them
    feeds = pad_batch(batch, int(batch.lengths.max()), manifest.pad_token_id)
    feeds = {name: feeds[name] for name in manifest.inputs}
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    inputs = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    errors = {}
    for node in nodes:
        x = inputs[node.input[0]].reshape(-1, weights[node.input[1]].dims[0]).astype(np.float64)
        w = numpy_helper.to_array(weights[node.input[1]]).astype(np.float64)
        exact = x @ w
        if node.name in row_scaled_nodes:
            rows = np.maximum(np.abs(x).max(axis=1, keepdims=True), 1e-12)
            x = x / rows
        else:
            rows = np.ones((len(x), 1))
        lo, hi = min(x.min(), 0.0), max(x.max(), 0.0)
        scale = (hi - lo) / 255 or 1.0
        zero = np.round(-lo / scale)
        x_q = (np.clip(np.round(x / scale) + zero, 0, 255) - zero) * scale
        w_scale = np.maximum(np.abs(w).max(axis=0, keepdims=True), 1e-12) / MAX_INT8_WEIGHT
        w_q = np.round(w / w_scale) * w_scale
        # per token, then averaged: a few outlier tokens set the one input scale and would dominate a norm over
        # the whole tensor, hiding how coarsely every other token is then resolved
        per_row = np.linalg.norm(rows * (x_q @ w_q) - exact, axis=1) / np.maximum(np.linalg.norm(exact, axis=1), 1e-12)
        errors[node.name] = float(per_row.mean())
    return errors


def search_int8(source: Path, out: Path, export_dir: Path, min_cosine: float = MIN_MEAN_COSINE,
                margin: float = 0.001, search_margin: float = 0.003, reference: Reference | None = None,
                layers: tuple[int, ...] = ROW_SCALED_LAYERS) -> dict[str, Any]:
    """`build_int8` with the fewest MatMuls left in float32 that lifts the mean cosine to fp32 on both quality
    sets (short sentences, long passages) to the gate, `min_cosine`, and a margin: none if the recipe passes
    with `margin` as it is (it does for all-MiniLM-L6-v2); else the GEMMs ranked by `local_int8_errors` on the
    quality texts, the worst 1, 2, 4, 8, ... of them in float until one passes with `search_margin`, then the
    fewest between the last two counts (bisection). The wider margin of the search: a model it has to lift to
    the gate sits near it, and other texts than the gate's (make bench's long ones) score a little lower.
    Each trial is built and measured (`measure`); the graph written to `out` is the one chosen (what it keeps in
    float for all-mpnet-base-v2: RESULTS.md "Any model a user brings"). Returns what was searched:
    {"float_matmuls": [...], "trials": [[count, short, long], ...]}; where even all of them in float do not pass,
    that graph, for the gate (`check`) to refuse."""
    target = min_cosine + margin
    reference = reference or Reference(export_dir, None)
    trials: list[list[float]] = []

    def passes(float_nodes: tuple[str, ...]) -> bool:  # at `target`
        build_int8(source, out, layers=layers, float_nodes=float_nodes)
        quality = measure(export_dir, out.name, None, reference)
        short, long = quality["mean_cosine_to_fp32"], quality["mean_cosine_to_fp32_long"]
        trials.append([len(float_nodes), short, long])
        log.info("int8 with %d MatMuls in float: mean cosine to fp32 %.4f short, %.4f long", len(float_nodes),
                 short, long)
        return min(short, long) >= target

    if passes(()):
        return {"float_matmuls": [], "trials": trials}
    target = min_cosine + search_margin
    import onnx

    row_scaled_nodes = {name for i, name in enumerate(ffn_outputs(onnx.load(str(source)).graph)) if i in layers}
    errors = local_int8_errors(source, export_dir, quality_sentences() + quality_long_sentences(), row_scaled_nodes)
    ranked = tuple(sorted(errors, key=errors.__getitem__, reverse=True))
    low, high = 0, 1  # fails with `low` in float; `high` is tried next
    while not passes(ranked[:high]):
        if high == len(ranked):  # none passes: the last graph is written, and `check` refuses it, saying why
            return {"float_matmuls": list(ranked), "trials": trials}
        low, high = high, min(2 * high, len(ranked))
    while high - low > 1:
        middle = (low + high) // 2
        if passes(ranked[:middle]):
            high = middle
        else:
            low = middle
    if trials[-1][0] != high:  # the last build tried fewer and failed: write the chosen graph again
        passes(ranked[:high])
    return {"float_matmuls": list(ranked[:high]), "trials": trials}


def row_scaled(model, names: set[str]) -> int:
    """Before each MatMul named (float, constant weight, no bias of its own), its input's rows divided by their
    largest |value| r, and its product multiplied back by r: x W = r ((x / r) W), the same function. Quantised
    per tensor afterwards, every row then spans about [-1, 1], so one uint8 scale resolves each token as finely
    as a scale per row would: the tokens with large activations no longer coarsen everyone else's. Costs two
    reads of the input (ReduceMax, ReduceMin) and a pass to scale it; how many MatMuls were wrapped."""
    from onnx import helper, numpy_helper

    graph = model.graph
    floor = "row_scale_floor"  # an all-zero row: 0 * (1 / floor) = 0, not 0 * inf
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 17)
    last_axis = {"axes": [-1]} if opset < 18 else {}  # an attribute until opset 18, an input since
    nodes, count = [], 0
    for node in graph.node:
        if node.op_type != "MatMul" or node.name not in names:
            nodes.append(node)
            continue
        x, name = node.input[0], node.name
        axis = [] if last_axis else ["row_scale_axis"]
        # max |x| as max(max x, -min x): two reads of x, where Abs would write a copy of it to read, a large share
        # of the pass on the widest inputs (`python -m benchmarks.int8_profile` shows where the time goes)
        nodes += [helper.make_node("ReduceMax", [x] + axis, [f"{name}_hi"], name=f"{name}_hi", keepdims=1, **last_axis),
                  helper.make_node("ReduceMin", [x] + axis, [f"{name}_lo"], name=f"{name}_lo", keepdims=1, **last_axis),
                  helper.make_node("Neg", [f"{name}_lo"], [f"{name}_neg_lo"], name=f"{name}_neg_lo"),
                  helper.make_node("Max", [f"{name}_hi", f"{name}_neg_lo", floor], [f"{name}_r"], name=f"{name}_r"),
                  helper.make_node("Reciprocal", [f"{name}_r"], [f"{name}_inv_r"], name=f"{name}_inv_r"),
                  helper.make_node("Mul", [x, f"{name}_inv_r"], [f"{name}_rows"], name=f"{name}_rows"),
                  helper.make_node("MatMul", [f"{name}_rows", node.input[1]], [f"{name}_scaled"], name=name),
                  helper.make_node("Mul", [f"{name}_scaled", f"{name}_r"], list(node.output), name=f"{name}_unscale")]
        count += 1
    if count:
        graph.initializer.append(numpy_helper.from_array(np.array(1e-12, np.float32), floor))
        if not last_axis:
            graph.initializer.append(numpy_helper.from_array(np.array([-1], np.int64), "row_scale_axis"))
    del graph.node[:]
    graph.node.extend(nodes)
    return count


#: onnxruntime's session option for its exact uint8 x int8 kernel on x86 CPUs without VNNI ("1"; slower), which
#: computes what a VNNI CPU computes: how the tests and `benchmarks.int8_configs --exact` show saturation
EXACT_INT8_KERNEL = "session.x64quantprecision"
#: the largest |int8 weight| whose products with uint8 activations no x86 kernel saturates: VPMADDUBSW (AVX2,
#: AVX-512 without VNNI) adds two products in int16, and 2 * 255 * 64 = 32,640 <= 32,767
MAX_INT8_WEIGHT = 64
#: the ops whose int8 weight (their second input) meets uint8 activations in onnxruntime's x86 GEMMs
_UINT8_X_INT8_OPS = {"MatMulInteger", "DynamicQuantizeMatMul", "QAttention", "MatMulIntegerToFloat"}


def saturating_int8_weights(model) -> list[str]:
    """The int8 GEMM weights of `model` with a value past `MAX_INT8_WEIGHT` (none: every x86 CPU computes
    its products exactly, VNNI or not)."""
    from onnx import TensorProto, numpy_helper

    weights = {init.name: init for init in model.graph.initializer}
    return [name for node in model.graph.node if node.op_type in _UINT8_X_INT8_OPS
            for name in node.input[1:2] if name in weights and weights[name].data_type == TensorProto.INT8
            and np.abs(numpy_helper.to_array(weights[name]).astype(np.int32)).max() > MAX_INT8_WEIGHT]


def plain_layer_norms(model) -> int:
    """Each com.microsoft SkipLayerNormalization as the residual sum and the LayerNormalization it fuses, when only
    its first output is read; how many. The same values, on kernels that are faster and spread over the threads:

    - onnxruntime 1.31's CPU SkipLayerNormalization is slower than Sub + LayerNormalization
      (`python -m benchmarks.onnx_ops` measures both);
    - but onnxruntime fuses Add + LayerNormalization back into it when it loads the graph, and Sum, which it does
      not fuse, runs on one thread whatever the session's count;
    - so where the input is an int8 GEMM's product (`_integer_matmul`), that GEMM's weights and bias are negated
      (exact: symmetric int8 weights) and the sum is skip - (-(x W + b)): a Sub, which nothing fuses, after an Add
      of the negated bias that onnxruntime folds into the GEMM (not after a row-scaled GEMM's Mul: there it stays
      an Add); elsewhere a Sum of input, bias and skip."""
    from onnx import helper, numpy_helper

    graph = model.graph
    read = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
    producers = {output: node for node in graph.node for output in node.output}
    initializers = {i.name: i for i in graph.initializer}
    uses: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    nodes, count, replaced = [], 0, []
    for node in graph.node:
        if node.op_type != "SkipLayerNormalization" or node.domain != "com.microsoft" or \
                any(name in read for name in node.output[1:] if name):
            nodes.append(node)
            continue
        x, skip, gamma = node.input[:3]
        beta = node.input[3] if len(node.input) > 3 and node.input[3] else ""
        bias = node.input[4] if len(node.input) > 4 and node.input[4] else ""
        epsilon = next((a.f for a in node.attribute if a.name == "epsilon"), 1e-12)
        total = f"{node.name}_sum"
        matmul = _integer_matmul(x, producers)
        weight = initializers.get(matmul.input[1]) if matmul is not None else None
        if weight is not None and uses[weight.name] == 1 and _symmetric_int8(matmul, initializers) and \
                (not bias or bias in initializers):
            q = numpy_helper.to_array(weight)
            weight.CopyFrom(numpy_helper.from_array(-q, weight.name))  # |q| <= 64 (MAX_INT8_WEIGHT): no overflow
            negated = x
            if bias:
                graph.initializer.append(numpy_helper.from_array(-numpy_helper.to_array(initializers[bias]),
                                                                 f"{node.name}_neg_bias"))
                replaced.append(bias)
                negated = f"{node.name}_neg"
                nodes.append(helper.make_node("Add", [x, f"{node.name}_neg_bias"], [negated], name=negated))
            nodes.append(helper.make_node("Sub", [skip, negated], [total], name=total))
        else:
            nodes.append(helper.make_node("Sum", [x] + ([bias] if bias else []) + [skip], [total], name=total))
        nodes.append(helper.make_node("LayerNormalization", [total, gamma] + ([beta] if beta else []),
                                      [node.output[0]], name=node.name, axis=-1, epsilon=epsilon))
        count += 1
    del graph.node[:]
    graph.node.extend(nodes)
    for name in replaced:
        if uses[name] == 1:
            graph.initializer.remove(initializers[name])
    return count


def plain_gelu(model) -> int:
    """Each com.microsoft BiasGelu as its bias added and a com.microsoft FastGelu (GELU's tanh approximation, whose
    difference from the erf GELU is far under int8's own error); how many. onnxruntime 1.31's CPU BiasGelu is
    slower than Sum + Gelu, and FastGelu faster than Gelu (`python -m benchmarks.onnx_ops` measures them).
    The bias goes into the int8 GEMM before it where there is one (an Add after its output scale, which
    onnxruntime folds into DynamicQuantizeMatMul: one pass over the tensor less); elsewhere a Sum, as in
    `plain_layer_norms`: onnxruntime fuses Add + Gelu back into BiasGelu."""
    from onnx import helper

    producers = {output: node for node in model.graph.node for output in node.output}
    nodes, count = [], 0
    for node in model.graph.node:
        if node.op_type != "BiasGelu" or node.domain != "com.microsoft":
            nodes.append(node)
            continue
        add = "Add" if _after_integer_matmul(node.input[0], producers) else "Sum"
        nodes.append(helper.make_node(add, list(node.input), [f"{node.name}_sum"], name=f"{node.name}_sum"))
        nodes.append(helper.make_node("FastGelu", [f"{node.name}_sum"], list(node.output), name=node.name,
                                      domain="com.microsoft"))
        count += 1
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return count


def _after_integer_matmul(tensor: str, producers: dict) -> bool:
    """`tensor` is the output scale's Mul of quantize_dynamic's MatMulInteger -> Cast -> Mul."""
    return _integer_matmul(tensor, producers, rows=False) is not None


def _integer_matmul(tensor: str, producers: dict, rows: bool = True):
    """The MatMulInteger whose product `tensor` is: MatMulInteger -> Cast -> Mul (its output scale), then with
    `rows` a Mul by any factor (`row_scaled`'s r: the product is still linear in the weights); None otherwise."""
    node = producers.get(tensor)
    if rows and node is not None and node.op_type == "Mul" and \
            _integer_matmul(node.input[0], producers, False) is not None:
        node = producers.get(node.input[0])
    for op in ("Mul", "Cast", "MatMulInteger"):
        if node is None or node.op_type != op:
            return None
        if op == "MatMulInteger":
            return node
        node = producers.get(node.input[0])
    return None


def _symmetric_int8(matmul, initializers: dict) -> bool:
    """Its weights int8 with zero points all 0 (or none): negating them negates the product exactly."""
    from onnx import TensorProto, numpy_helper

    if initializers[matmul.input[1]].data_type != TensorProto.INT8:
        return False
    if len(matmul.input) < 4 or not matmul.input[3]:
        return True
    zero = initializers.get(matmul.input[3])
    return zero is not None and not numpy_helper.to_array(zero).any()


def ffn_outputs(graph) -> list[str]:
    """The feed-forward output MatMuls in layer order: those whose constant weight narrows (K > N), as only
    the projection from the intermediate size back to the hidden size does in a transformer layer (a head
    after the pooling may too: it comes after them)."""
    shapes = {init.name: list(init.dims) for init in graph.initializer}
    return [node.name for node in graph.node if node.op_type == "MatMul" and len(shapes.get(node.input[1], [])) == 2
            and shapes[node.input[1]][0] > shapes[node.input[1]][1]]


#: the LayerNorm ops a transformer layer ends with
_LAYER_NORMS = {"LayerNormalization", "SkipLayerNormalization", "SimplifiedLayerNormalization",
                "SkipSimplifiedLayerNormalization"}


def build_fp16(source: Path, out: Path, float32_norms: bool = False) -> None:
    """`source` (the fused graph) in float16, inputs and outputs as they were (int64 in, float32 out), so
    the service feeds and reads it as it does the fp32 graph.

    What does not lead to the last layer's output (mean pooling over the sequence, any head, the L2
    normalisation) stays float32: a few hundred FLOPs a row, and in float16 the served vectors come out
    off unit length by more than the golden check allows.
    `float32_norms`: the normalisation layers (the nodes of modules named *norm*) stay float32 too, as
    transformers computes an RMSNorm in float32 whatever the model's dtype (the decoders', Gemma's):
    a tiny Gemma 3 lost its fp16 gate without it (RESULTS.md "Any model a user brings")."""
    import onnx
    from onnxruntime.transformers.onnx_model import OnnxModel

    model = OnnxModel(onnx.load(str(source)))
    block = _after_the_transformer(model.model.graph)
    if float32_norms:
        block += [node.name for node in model.model.graph.node if "norm" in node.name.lower()]
    model.convert_float_to_float16(keep_io_types=True, node_block_list=block)
    _drop_repeated_nodes(model.model.graph)
    model.save_model_to_file(str(out))  # sorts the nodes topologically, as the checker wants them
    onnx.checker.check_model(str(out))  # an invalid graph fails here, named, not when the service loads it


def _drop_repeated_nodes(graph) -> int:
    """Remove nodes that repeat an earlier one exactly (name, inputs, outputs, attributes), and repeated
    value_info; the count of nodes removed.

    onnxruntime 1.31's float16 conversion (`onnxruntime.transformers.float16`) gives each float32 node it
    keeps a Cast of each float16 input back to float32, named after the input alone
    (`<input>_cast_to_fp32_node`, output `<input>_cast_to_fp32`): a tensor that two kept nodes read (the
    pooling's float attention mask: ReduceSum and Unsqueeze) gets two identical Casts, one name and one
    output defined twice, which onnxruntime refuses to load ("two nodes with same node name"). Both
    readers read that one output, so one Cast serves both: the graph is then the one onnxruntime 1.32 builds
    (same nodes, initializers and value_info on the default model). Nodes that share a name or an output but
    differ are a real conflict, left for the checker to report."""
    removed = _drop_repeats(graph.node)
    _drop_repeats(graph.value_info)  # the conversion also records the repeated Cast's output twice
    if removed:
        log.info("fp16: dropped %d repeated node(s) that the float16 conversion added", removed)
    return removed


def _drop_repeats(entries) -> int:
    """Delete the protobuf entries that repeat an earlier one byte for byte; how many."""
    seen: set[bytes] = set()
    repeats = []
    for i, entry in enumerate(entries):
        key = entry.SerializeToString(deterministic=True)
        if key in seen:
            repeats.append(i)
        seen.add(key)
    for i in reversed(repeats):
        del entries[i]
    return len(repeats)


def _after_the_transformer(graph) -> list[str]:
    """Names of the nodes the last LayerNorm's output does not depend on (none if the graph has no LayerNorm).
    A LayerNorm is one of onnxruntime's ops, or where there is none (an RMSNorm traced as plain ops), the nodes
    of a module named *norm*."""
    nodes = list(graph.node)  # in topological order: the last LayerNorm is the last layer's
    producer = {output: i for i, node in enumerate(nodes) for output in node.output}
    norms = ([i for i, node in enumerate(nodes) if node.op_type in _LAYER_NORMS]
             or [i for i, node in enumerate(nodes) if "norm" in node.name.lower()])
    if not norms:
        return []
    needed, stack = set(), [norms[-1]]
    while stack:
        i = stack.pop()
        if i not in needed:
            needed.add(i)
            stack.extend(producer[name] for name in nodes[i].input if name in producer)
    return [node.name for i, node in enumerate(nodes) if i not in needed]


def cpu_float32_ops(graph: Path) -> list[str]:
    """The op types of `graph` that onnxruntime's CPU provider runs in float32 although the graph gives
    them float16 inputs: it has no float16 kernel for them and inserts Casts around them (visible in the
    graph it would run, saved here at optimisation level 0)."""
    import tempfile

    import onnx
    import onnxruntime as ort

    original = {n.name for n in onnx.load(str(graph), load_external_data=False).graph.node}
    with tempfile.TemporaryDirectory() as tmp:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.optimized_model_filepath = str(Path(tmp) / "cpu.onnx")
        ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])
        ran = onnx.load(options.optimized_model_filepath, load_external_data=False).graph
    upcast = {n.output[0] for n in ran.node if n.op_type == "Cast" and n.name not in original
              and any(a.name == "to" and a.i == onnx.TensorProto.FLOAT for a in n.attribute)}
    return sorted({n.op_type for n in ran.node if n.op_type != "Cast" and upcast.intersection(n.input)})


def fp16_note(float32_ops: list[str]) -> str:
    """What an fp16 variant's recorded quality measures: the export has no GPU, so onnxruntime's CPU provider."""
    if not float32_ops:
        return ("measured with onnxruntime's CPU execution provider, which ran every op of this graph in float16; "
                "a GPU's float16 kernels may round differently")
    return ("measured with onnxruntime's CPU execution provider, not on a GPU: it has no float16 kernels for "
            f"{', '.join(float32_ops)} and ran those in float32 on the float16 weights and inputs (casting "
            "their outputs back to float16), so these figures measure float16 weights and float16 tensors "
            "between ops, not a GPU's float16 arithmetic inside them")


class Reference:
    """The fp32 graph's vectors for the quality sets, computed once for every variant measured."""

    def __init__(self, export_dir: Path, stsb_dev: list[tuple[str, str, float]] | None):
        from service.engine.backends.onnx import OnnxBackend

        self.backend = OnnxBackend(export_dir, pad_to_multiple_of=1, verify=False)
        self.short = self.backend.encode(quality_sentences())
        self.long = self.backend.encode(quality_long_sentences())
        self.stsb_spearman = _stsb_spearman(self.backend, stsb_dev) if stsb_dev else None


def _stsb_spearman(backend, stsb_dev: list[tuple[str, str, float]]) -> float:
    from scipy.stats import spearmanr

    left = backend.encode([s1 for s1, _, _ in stsb_dev])
    right = backend.encode([s2 for _, s2, _ in stsb_dev])
    return 100 * float(spearmanr((left * right).sum(axis=1), [score for _, _, score in stsb_dev]).statistic)


def measure(export_dir: Path, variant_file: str, stsb_dev: list[tuple[str, str, float]] | None,
            reference: Reference | None = None) -> dict[str, Any]:
    """Cosine of the variant's embeddings to fp32's on the short sentences and on the long passages, and
    STS-B dev Spearman of both when given pairs (`reference`, if given, was made with the same pairs).
    Run here, on this machine's CPU (`measured_on`)."""
    from service.engine.backends.onnx import OnnxBackend

    reference = reference or Reference(export_dir, stsb_dev)
    variant = OnnxBackend(export_dir, pad_to_multiple_of=1, verify=False, graph_file=variant_file)
    short = (variant.encode(quality_sentences()) * reference.short).sum(axis=1)
    long = (variant.encode(quality_long_sentences()) * reference.long).sum(axis=1)
    quality: dict[str, Any] = {"mean_cosine_to_fp32": round(float(short.mean()), 5),
                               "min_cosine_to_fp32": round(float(short.min()), 5),
                               "mean_cosine_to_fp32_long": round(float(long.mean()), 5),
                               "min_cosine_to_fp32_long": round(float(long.min()), 5),
                               "stsb_dev_spearman": None, "stsb_dev_spearman_fp32": None, "stsb_dev_delta": None,
                               "measured_on": "cpu"}
    if stsb_dev:
        fp32, spearman = reference.stsb_spearman, _stsb_spearman(variant, stsb_dev)
        quality.update(stsb_dev_spearman=round(spearman, 3), stsb_dev_spearman_fp32=round(fp32, 3),
                       stsb_dev_delta=round(spearman - fp32, 3))
    golden = reference.backend.manifest.golden
    if golden:
        quality["golden_embeddings"] = np.round(variant.encode(golden["sentences"]).astype(np.float64), 7).tolist()
    return quality


def check(quality: dict[str, Any], max_drop: float = MAX_STSB_DROP, min_cosine: float = MIN_MEAN_COSINE,
          variant: str = "int8") -> None:
    """Refuse a variant whose mean cosine to fp32 is under `min_cosine` on either sentence set, or that
    loses more than `max_drop` STS-B dev Spearman points."""
    problems = []
    for key, texts in (("mean_cosine_to_fp32", "short sentences"), ("mean_cosine_to_fp32_long", "long passages")):
        value = quality.get(key)
        if value is not None and value < min_cosine:
            problems.append(f"its mean cosine to fp32 on the {texts} is {value:.4f} (below {min_cosine})")
    delta = quality.get("stsb_dev_delta")
    if delta is not None and delta < -max_drop:
        problems.append(f"it loses {-delta:.2f} STS-B dev Spearman points (more than {max_drop})")
    if problems:
        raise QualityError(f"{variant}: " + "; ".join(problems))
