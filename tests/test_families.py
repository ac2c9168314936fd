"""Any model a user brings, served as sentence-transformers serves it: one tiny random-weight model per family
(tests/tiny_models.py), every pooling mode and module type, exported and compared with SentenceTransformer.encode;
what the export cannot reproduce is refused by name with nothing written."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import numpy as np
import pytest

from core.encoder import SentenceEncoder
from export.__main__ import main as export_main
from export.exporter import export_onnx
from service.engine.backends.onnx import OnnxBackend
from service.manifest import Manifest
from tests.conftest import REPO, free_port, wait_ready
from tests.tiny_models import DECODERS, ENCODERS, FAMILIES, build

TEXTS = ["Hi", "A man is playing a guitar and singing loudly.", "x " * 300, "naïve café déjà-vu", "",
         "Stocks fell sharply on Monday."]
PROMPTS = {"query": "query: ", "document": "passage: "}
TOLERANCE = 1e-4


def _reference(model_dir, texts=TEXTS, **kwargs) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(model_dir), device="cpu").encode(texts, normalize_embeddings=True, **kwargs)


@pytest.fixture(scope="module")
def family_exports(tmp_path_factory):
    """Each family built with prompts and exported once: {family: (source dir, export dir)}."""
    root = tmp_path_factory.mktemp("families")
    out = {}
    for family in FAMILIES:
        source = build(family, root / "src" / family, prompts=PROMPTS, default_prompt_name="query")
        export_onnx(SentenceEncoder.from_pretrained(source), root / "exports" / family, int8=False, fp16=False)
        out[family] = (source, root / "exports" / family)
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_exports_as_sentence_transformers_encodes(family_exports, family):
    source, export = family_exports[family]
    backend = OnnxBackend(export)
    # one padded batch, as the service runs it (padded on the right; the decoders' tokenizers pad on the left)
    assert np.abs(backend.encode(TEXTS, batch_size=len(TEXTS)) - _reference(source, prompt="")).max() <= TOLERANCE
    # prompts: the model's default applies unless another is named; the graph sees prompt + text
    for name, prompt in PROMPTS.items():
        expected = _reference(source, prompt_name=name)
        assert np.abs(backend.encode([prompt + t for t in TEXTS]) - expected).max() <= TOLERANCE
    assert np.abs(_reference(source) - _reference(source, prompt_name="query")).max() == 0
    # the ASCII WordPiece fast path only for BERT's own pipeline (the encoders here reuse BERT's tokenizer);
    # byte-level BPE with left padding and an appended EOS goes to tokenizers
    assert (backend.tokenizer.wordpiece is None) == (family not in ENCODERS)
    manifest = Manifest.load(export)
    assert (manifest.prompts, manifest.default_prompt_name) == (PROMPTS, "query")
    assert manifest.pooling == ("lasttoken" if family in DECODERS else "mean")


def test_the_decoders_append_eos_and_their_graph_finds_the_last_real_token(family_exports):
    _, export = family_exports["qwen3"]
    backend = OnnxBackend(export)
    batch, _ = backend.tokenizer.encode(["A man is playing a guitar."])
    eos = json.loads((export / "tokenizer_config.json").read_text())["eos_token"]
    assert backend.tokenizer._right.id_to_token(int(batch.ids[-1])) == eos
    assert "token_type_ids" not in Manifest.load(export).inputs  # the BPE names none; Qwen3 takes none


@pytest.mark.parametrize("pooling", ["cls", "max", "mean_sqrt_len_tokens", "weightedmean", "lasttoken", "cls+mean"])
def test_every_pooling_mode_matches_sentence_transformers(tmp_path, pooling):
    source = build("bert", tmp_path / "src", pooling=pooling, dense=24)
    encoder = SentenceEncoder.from_pretrained(source)
    assert encoder.pooling == pooling
    export_onnx(encoder, tmp_path / "out", int8=False, fp16=False)
    got = OnnxBackend(tmp_path / "out").encode(TEXTS, batch_size=len(TEXTS))
    assert got.shape[1] == 24  # the Dense head is in the graph
    assert np.abs(got - _reference(source)).max() <= TOLERANCE


def test_a_weighted_layer_pooling_matches_sentence_transformers(tmp_path):
    source = build("xlm-roberta", tmp_path / "src", layer_weights=(1, [0.25, 2.0]))
    encoder = SentenceEncoder.from_pretrained(source)
    assert encoder.layer_weights is not None and encoder.layer_weights.weights.tolist() == [0.25, 2.0]
    export_onnx(encoder, tmp_path / "out", int8=False, fp16=False)
    assert np.abs(OnnxBackend(tmp_path / "out").encode(TEXTS) - _reference(source)).max() <= TOLERANCE
    encoder.save_pretrained(tmp_path / "saved")  # and it saves as it loaded
    assert np.abs(_reference(tmp_path / "saved") - _reference(source)).max() <= 1e-6


def test_the_position_table_bounds_max_seq_length(tmp_path, capsys):
    """RoBERTa-style models number positions from padding_idx + 1: the tiny XLM-R's 130 positions with padding
    index 0 hold 129 tokens. The limit itself exports with parity on a text longer than it; one more is refused
    with the real maximum named and nothing written."""
    source = build("xlm-roberta", tmp_path / "src")
    encoder = SentenceEncoder.from_pretrained(source, max_seq_length=129)
    export_onnx(encoder, tmp_path / "ok", int8=False, fp16=False)  # PARITY_SENTENCES hold a 600-word text
    assert OnnxBackend(tmp_path / "ok").tokenizer.encode(["long " * 300])[0].lengths.tolist() == [129]
    assert export_main(["--model", str(source), "--out", str(tmp_path / "over"), "--max-seq-length", "130"]) == 2
    assert "position table: it takes at most 129 tokens" in capsys.readouterr().err
    assert not (tmp_path / "over").exists()


@pytest.mark.parametrize(("change", "refusal"), [
    (lambda d: _edit(d / "1_Pooling" / "config.json", include_prompt=False), "include_prompt=false"),
    (lambda d: _edit(d / "1_Pooling" / "config.json", pooling_mode="splade"), "unsupported pooling 'splade'"),
    (lambda d: (d / "modules.json").write_text(json.dumps(
        json.loads((d / "modules.json").read_text())
        + [{"idx": 9, "name": "9", "path": "", "type": "sentence_transformers.models.LSTM"}])),
     "unsupported sentence-transformers module sentence_transformers.models.LSTM"),
    (lambda d: _edit(d / "config.json", architectures=["BertForSequenceClassification"], num_labels=1,
                     sentence_transformers={"activation_fn": "torch.nn.modules.activation.Softplus"}),
     "unsupported CrossEncoder activation 'torch.nn.modules.activation.Softplus'"),
])
def test_what_the_export_cannot_reproduce_is_refused_by_name(tmp_path, capsys, change, refusal):
    source = build("bert", tmp_path / "src")
    change(source)
    assert export_main(["--model", str(source), "--out", str(tmp_path / "out"), "--no-int8", "--no-fp16"]) == 2
    assert refusal in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def _edit(path, **changes) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_a_live_service_serves_every_family_as_sentence_transformers_encodes(family_exports, tmp_path):
    """`python -m service` with every family's export beside the others (SEMBED_MODELS), called over HTTP by
    model name: the vectors are sentence-transformers' to 1e-4."""
    port = free_port()
    models = ",".join(f"{family}={export}" for family, (_, export) in family_exports.items())
    env = {**os.environ, "SEMBED_MODELS": models, "SEMBED_PORT": str(port), "SEMBED_HOST": "127.0.0.1",
           "SEMBED_API_WORKERS": "1", "SEMBED_INDEX_PATH": ":memory:", "SEMBED_ACCESS_LOG": "false"}
    log = tmp_path / "service.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "service"], cwd=REPO, env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, log, timeout=180)
        texts = [t for t in TEXTS if t]  # OpenAI's route refuses an empty string, as OpenAI does
        for family, (source, _) in family_exports.items():
            answer = httpx.post(f"{url}/v1/embeddings", json={"input": texts, "model": family}, timeout=60)
            assert answer.status_code == 200, answer.text
            got = np.array([row["embedding"] for row in answer.json()["data"]], dtype=np.float32)
            # the service puts the model's default prompt ("query: ") before each text, as encode() does
            assert np.abs(got - _reference(source, texts)).max() <= TOLERANCE, family
            answer = httpx.post(f"{url}/v1/embeddings", json={"input": texts, "model": family,
                                                              "prompt_name": "document"}, timeout=60)
            got = np.array([row["embedding"] for row in answer.json()["data"]], dtype=np.float32)
            assert np.abs(got - _reference(source, texts, prompt_name="document")).max() <= TOLERANCE, family
            # TEI's routes pick the model by the same field (TEI itself serves one)
            answer = httpx.post(f"{url}/embed", json={"inputs": texts, "model": family}, timeout=60)
            assert np.abs(np.array(answer.json()) - _reference(source, texts)).max() <= TOLERANCE, family
        missing = httpx.post(f"{url}/embed", json={"inputs": "x", "model": "no-such-model"}, timeout=60)
        assert missing.status_code == 404 and "qwen3" in missing.text, missing.text
    finally:
        proc.terminate()
        proc.wait(timeout=60)


@pytest.mark.parametrize(("family", "activation"), [("bert", None), ("mpnet", "Identity")])
def test_a_hugging_face_reranker_exports_as_a_pair_scorer_with_crossencoder_predict_scores(tmp_path, family,
                                                                                          activation):
    """An HF *ForSequenceClassification with one label (the ms-marco cross-encoders, bge-reranker) exports as a
    pair scorer, BERT's pooler included; its logit through the activation its config names is exactly
    CrossEncoder.predict, before and after export."""
    import torch
    from sentence_transformers import CrossEncoder
    from transformers import AutoModelForSequenceClassification

    source = build(family, tmp_path / "base")
    config = json.loads((source / "config.json").read_text())
    head = config["architectures"][0].replace("Model", "ForSequenceClassification")
    config.update(num_labels=1, architectures=[head])
    if activation:
        config["sentence_transformers"] = {"activation_fn": f"torch.nn.modules.linear.{activation}"}
    (source / "config.json").write_text(json.dumps(config))
    torch.manual_seed(1)
    AutoModelForSequenceClassification.from_pretrained(source).save_pretrained(source)  # a random head, saved
    (source / "modules.json").unlink()  # a plain HF reranker directory
    assert export_main(["--model", str(source), "--out", str(tmp_path / "out")]) == 0
    manifest = Manifest.load(tmp_path / "out")
    assert (manifest.kind, manifest.score_activation) == ("cross-encoder", activation or "Sigmoid")
    pairs = [("Who is making music?", t) for t in TEXTS] + [("long " * 200, "Hi")]
    expected = CrossEncoder(str(source), device="cpu").predict(pairs)
    logits = OnnxBackend(tmp_path / "out").score_pairs(pairs)
    scores = 1 / (1 + np.exp(-logits)) if activation is None else logits
    assert np.abs(scores - expected).max() <= TOLERANCE
    # served: /rerank answers CrossEncoder.predict's scores, through the activation the manifest names
    from service.settings import Settings
    from tests.conftest import LiveServer

    texts = [t for _, t in pairs[:-1]]
    with LiveServer(Settings(model_dir=tmp_path / "out")) as server:
        hits = httpx.post(f"{server.url}/rerank", json={"query": pairs[0][0], "texts": texts}, timeout=60).json()
    assert {h["index"]: h["score"] for h in hits} == pytest.approx(dict(enumerate(expected[:-1].tolist())),
                                                                 abs=TOLERANCE)


def test_int8_keeps_in_float_what_a_model_needs_to_pass_the_gate(tmp_path):
    """The int8 recipe quantises every weight GEMM; where that loses the cosine gate, the export searches for
    the fewest MatMuls to keep in float. One feed-forward channel of layer 1 made an outlier (a bias of 200 on
    one intermediate unit: every token's input to the output projection then spans 200, so one uint8 scale per
    tensor resolves the rest coarsely): the search finds that projection and the graph passes."""
    import torch
    from sentence_transformers import SentenceTransformer

    source = build("bert", tmp_path / "src", max_seq_length=128)
    model = SentenceTransformer(str(source), device="cpu")
    layer = model[0].auto_model.encoder.layer[1]
    with torch.no_grad():
        layer.output.dense.weight *= 50  # the feed-forward part counts in the output, as in a trained model
        layer.intermediate.dense.bias[0] = 5000.0
        layer.output.dense.weight[:, 0] = 0  # the outlier unit adds nothing to the output itself
    model.save(str(source))
    export_onnx(SentenceEncoder.from_pretrained(source), tmp_path / "out", fp16=False)
    int8 = Manifest.load(tmp_path / "out").variants["int8"]
    assert "layer.1/output/dense/MatMul" in " ".join(int8["search"]["float_matmuls"])
    assert len(int8["search"]["float_matmuls"]) <= 4
    assert int8["search"]["trials"][0][1:] != int8["search"]["trials"][-1][1:]
    first = int8["search"]["trials"][0]
    quality = int8["quality"]
    assert min(first[1:]) < 0.99 <= min(quality["mean_cosine_to_fp32"], quality["mean_cosine_to_fp32_long"])


def test_a_sequence_classifier_exports_and_answers_teis_predict(tmp_path):
    """An HF *ForSequenceClassification with several labels exports as a classifier (never as an embedding model)
    and answers TEI's /predict for a text, a pair and a batch of both: the softmax of the model's own logits, the
    logits themselves with raw_scores (what CrossEncoder.predict gives such a model), labels from id2label."""
    import torch
    from sentence_transformers import CrossEncoder
    from transformers import AutoModelForSequenceClassification

    from service.settings import Settings
    from tests.conftest import LiveServer

    source = build("bert", tmp_path / "base")
    (source / "modules.json").unlink()
    labels = {0: "contradiction", 1: "entailment", 2: "neutral"}
    torch.manual_seed(2)
    hf = AutoModelForSequenceClassification.from_pretrained(source, num_labels=3, id2label=labels,
                                                            label2id={v: k for k, v in labels.items()})
    hf.save_pretrained(source)
    assert export_main(["--model", str(source), "--out", str(tmp_path / "out")]) == 0
    manifest = Manifest.load(tmp_path / "out")
    assert (manifest.kind, manifest.dimension, manifest.id2label) == ("classifier", 3, {str(k): v for k, v in
                                                                                       labels.items()})
    inputs = ["A man is playing a guitar.", ("A man plays.", "Nobody makes music."), "x " * 300]
    tokenizer = CrossEncoder(str(source), device="cpu").tokenizer
    with torch.no_grad():
        logits = [hf.eval()(**tokenizer(*([x] if isinstance(x, str) else x), truncation=True, max_length=128,
                                        return_tensors="pt")).logits[0].numpy() for x in inputs]
    expected_raw = CrossEncoder(str(source), device="cpu").predict([("A man plays.", "Nobody makes music.")])[0]
    assert np.abs(logits[1] - expected_raw).max() <= TOLERANCE

    def scores(answer) -> np.ndarray:
        by_label = {hit["label"]: hit["score"] for hit in answer}
        assert [hit["score"] for hit in answer] == sorted(by_label.values(), reverse=True)
        return np.array([by_label[labels[i]] for i in range(3)])

    with LiveServer(Settings(model_dir=tmp_path / "out")) as server, httpx.Client(base_url=server.url) as client:
        one = client.post("/predict", json={"inputs": inputs[0]}).json()
        softmax = np.exp(logits[0]) / np.exp(logits[0]).sum()
        assert np.abs(scores(one) - softmax).max() <= TOLERANCE
        pair = client.post("/predict", json={"inputs": list(inputs[1]), "raw_scores": True}).json()
        assert np.abs(scores(pair) - logits[1]).max() <= TOLERANCE
        batch = client.post("/predict", json={"inputs": [[inputs[0]], list(inputs[1]), [inputs[2]]],
                                               "raw_scores": True}).json()
        assert len(batch) == 3
        for answer, expected in zip(batch, logits):
            assert np.abs(scores(answer) - expected).max() <= TOLERANCE
        assert client.get("/info").json()["model_type"]["classifier"]["label2id"]["neutral"] == 2
        refused = client.post("/embed", json={"inputs": "x"})
        assert refused.status_code == 424 and "classifier" in refused.text
        assert client.post("/predict", json={"inputs": ["a", "b", "c"]}).status_code == 422
        assert client.post("/rerank", json={"query": "a", "texts": ["b"]}).status_code == 424


def test_code_outside_transformers_runs_only_when_the_user_trusts_it(tmp_path, capsys):
    """A model whose config maps AutoModel to its own modelling file (as NomicBERT's and JinaBERT's do) is
    refused by name without --trust-remote-code; with it, the export runs that code and its parity check
    still guards the graph against SentenceTransformer(trust_remote_code=True)."""
    source = build("bert", tmp_path / "src")
    (source / "modeling_tiny.py").write_text(
        "from transformers import BertConfig, BertModel\n\n\n"
        "class TinyConfig(BertConfig):\n    model_type = 'tiny_remote'\n\n\n"
        "class TinyModel(BertModel):\n    config_class = TinyConfig\n\n"
        "    def __init__(self, config, add_pooling_layer=False):\n"
        "        super().__init__(config, add_pooling_layer=False)\n")
    _edit(source / "config.json", model_type="tiny_remote", architectures=["TinyModel"],
          auto_map={"AutoConfig": "modeling_tiny.TinyConfig", "AutoModel": "modeling_tiny.TinyModel"})
    assert export_main(["--model", str(source), "--out", str(tmp_path / "no"), "--no-int8", "--no-fp16"]) == 2
    assert "trust_remote_code" in capsys.readouterr().err
    assert not (tmp_path / "no").exists()
    assert export_main(["--model", str(source), "--out", str(tmp_path / "yes"), "--no-int8", "--no-fp16",
                        "--trust-remote-code"]) == 0
    from sentence_transformers import SentenceTransformer

    expected = SentenceTransformer(str(source), device="cpu", trust_remote_code=True).encode(
        TEXTS, normalize_embeddings=True)
    assert np.abs(OnnxBackend(tmp_path / "yes").encode(TEXTS) - expected).max() <= TOLERANCE


@pytest.mark.parametrize("family", ["qwen3", "gemma3", "modernbert"])
def test_int8_and_fp16_are_written_for_families_without_bert_fusions(tmp_path, family):
    """Decoders and Gemma 3 take their variants from the plain graph (onnxruntime's BERT fusions do not fit
    them), with their RMSNorms in float32 in fp16 as transformers computes them (a tiny Gemma 3's fp16 had a
    mean cosine of 0.948 to fp32 without); each variant passes the gate and the service's golden check."""
    source = build(family, tmp_path / "src")
    manifest = export_onnx(SentenceEncoder.from_pretrained(source), tmp_path / "out")
    assert set(manifest.variants) == {"fp32", "int8", "fp16"}, getattr(manifest, "variants_left_out", None)
    for variant in ("int8", "fp16"):
        quality = manifest.variants[variant]["quality"]
        assert min(quality["mean_cosine_to_fp32"], quality["mean_cosine_to_fp32_long"]) >= 0.99
        OnnxBackend(tmp_path / "out", variant=variant).self_check()
