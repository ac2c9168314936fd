"""CoSENT's cross-encoder (Eq. 11) end to end: the loss by hand, training with a pair-score dev metric,
an ONNX export that scores pairs as torch does, and the service answering /rerank from it."""

from __future__ import annotations

import json
import math

import httpx
import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from torch import nn

from core.data import ScoredPair
from service.api.registry import ModelRegistry
from service.engine.backends.fake import FakeBackend
from service.engine.core import Engine
from service.manifest import CROSS_ENCODER
from service.settings import Settings
from training.config import PRESETS, make_config
from training.objectives import get_objective
from training.objectives.cosent import CoSENTCrossEncoder

QUERY = "a man is playing a guitar"
TEXTS = ["stocks fell sharply on monday", "a man plays the guitar", "a man is playing a guitar on stage",
         "the cat sleeps"]


class _CountingTransformer(nn.Module):
    """Stands in for BERT: the [CLS] state's first component is the pair's token count."""

    def __init__(self, config):
        super().__init__()
        self.config = config

    def forward(self, input_ids, attention_mask, token_type_ids=None, return_dict=True):
        hidden = torch.zeros(*input_ids.shape, self.config.hidden_size)
        hidden[:, 0, 0] = attention_mask.sum(1).float()
        return type("Out", (), {"last_hidden_state": hidden})()


def test_loss_is_eq_11_on_a_hand_computed_example(tiny_encoder):
    objective = get_objective("cosent-cross")(tiny_encoder)
    assert isinstance(objective, CoSENTCrossEncoder) and objective.scale == 20.0
    assert objective.data_kind == "scored" and objective.batch_sampler is None  # as the siamese CoSENT
    scorer = objective.inference_encoder()
    scorer.transformer = _CountingTransformer(scorer.transformer.config)
    with torch.no_grad():  # f(i, j) = 0.05 × the pair's token count ([CLS] a.. [SEP] b.. [SEP])
        scorer.classifier.weight.zero_()
        scorer.classifier.weight[0, 0] = 0.05
        scorer.classifier.bias.zero_()
    pairs = [ScoredPair("cat", "dog", 1.0),  # 5 tokens: f = 0.25
             ScoredPair("cat sat", "dog ran", 3.0),  # 7 tokens: f = 0.35
             ScoredPair("the cat sat down", "a dog", 2.0)]  # 9 tokens: f = 0.45
    batch = objective.collate(pairs)
    assert batch["features"]["attention_mask"].sum(1).tolist() == [5, 7, 9]
    out = objective.eval()(batch)
    # Eq. 11 over the label-ranked pairs (1 > 0), (2 > 0), (1 > 2): λ(f_low − f_high) = −2, −4, +2
    assert out["loss"].item() == pytest.approx(math.log(1 + math.exp(-2) + math.exp(-4) + math.exp(2)), rel=1e-6)


def test_presets():
    quick, paper = make_config("cosent-cross", "quick"), make_config("cosent-cross", "paper")
    assert quick.train_data == paper.train_data == "stsb:train"
    # §IV-C: lr 2e-5, weight decay 0.01, 10% warm-up, 4 epochs, batch 16
    assert (paper.lr, paper.weight_decay, paper.warmup_ratio, paper.epochs) == (2e-5, 0.01, 0.1, 4)
    assert paper.batch_size == 16
    assert "cosent-cross" in PRESETS["quick"] and quick.base_model == "default"


@pytest.fixture(scope="module")
def trained(tiny_model_dir, shared_data, tmp_path_factory):
    from training.train import train_and_export

    tmp = tmp_path_factory.mktemp("cross")
    cfg = make_config("cosent-cross", "quick", base_model=str(tiny_model_dir), data_dir=shared_data, train_limit=64,
                      batch_size=16, lr=1e-3, warmup_ratio=0.0, epochs=12, max_steps=20, eval_every=10,
                      max_seq_length=24, runs_dir=tmp / "runs", models_dir=tmp / "models")
    export_dir = train_and_export(cfg, log=lambda *_: None)
    return next((tmp / "runs").iterdir()), export_dir


@pytest.mark.slow  # `trained`: a training run with STS-B dev evaluations, then an export
def test_trains_with_pair_score_model_selection(trained, shared_data):
    from core.cross_encoder import CrossEncoder
    from core.sts import stsb_dev_pair_spearman

    run_dir, export_dir = trained
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if "loss" in r]
    assert len(losses) == 20 and np.mean(losses[-5:]) < np.mean(losses[:5])
    devs = {r["step"]: r["dev"] for r in rows if "dev" in r}
    assert list(devs) == [0, 10, 20]
    best = CrossEncoder.from_pretrained(run_dir / "best")
    # the saved best is the pair scorer of the best dev step, measured on its own scores
    assert stsb_dev_pair_spearman(best.score_pairs, shared_data) == pytest.approx(max(devs.values()), abs=1e-3)
    manifest = json.loads((export_dir / "manifest.json").read_text())
    assert manifest["training"]["dev_score"] == pytest.approx(max(devs.values()), abs=1e-4)


@pytest.mark.slow  # `trained`: a training run with STS-B dev evaluations, then an export
def test_export_is_a_pair_scorer_with_torch_parity(trained):
    import onnx

    from core.cross_encoder import CrossEncoder
    from service.engine.backends.onnx import OnnxBackend

    run_dir, export_dir = trained
    manifest = json.loads((export_dir / "manifest.json").read_text())
    assert manifest["kind"] == CROSS_ENCODER and manifest["method"] == "cosent-cross"
    assert manifest["outputs"] == ["score"] and manifest["dimension"] == 1 and manifest["max_seq_length"] == 24
    assert manifest["parity_max_abs_diff"] <= 1e-4
    graph = onnx.load(str(export_dir / "model.onnx")).graph
    assert [i.name for i in graph.input] == ["input_ids", "attention_mask", "token_type_ids"]
    assert [[d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim] for o in graph.output] == [["batch"]]

    torch_model = CrossEncoder.from_pretrained(run_dir / "best")
    first = [QUERY] * len(TEXTS) + ["word " * 40, "x"]  # one pair past max_seq_length: cut the same way
    second = TEXTS + ["short", "y " * 50]
    expected = torch_model.score_pairs(first, second)
    backend = OnnxBackend(export_dir)
    backend.self_check()  # its golden pairs score as recorded
    assert np.abs(backend.score_pairs(list(zip(first, second))) - expected).max() <= 1e-4
    assert np.abs(backend.score_pairs(list(zip(first, second)), batch_size=1) - expected).max() <= 1e-4


@pytest.mark.slow  # `trained`: a training run with STS-B dev evaluations, then an export
def test_service_reranks_with_the_export_and_refuses_embeddings(trained):
    from core.cross_encoder import CrossEncoder
    from tests.conftest import LiveServer

    run_dir, export_dir = trained
    logits = CrossEncoder.from_pretrained(run_dir / "best").score_pairs([QUERY] * len(TEXTS), TEXTS)
    with LiveServer(Settings(model_dir=export_dir)) as server, httpx.Client(base_url=server.url, timeout=60) as c:
        r = c.post("/rerank", json={"query": QUERY, "texts": TEXTS, "return_text": True})
        assert r.status_code == 200, r.text
        hits = r.json()
        assert [h["index"] for h in hits] == np.argsort(-logits, kind="stable").tolist()
        assert [h["text"] for h in hits] == [TEXTS[h["index"]] for h in hits]
        sigmoid = 1 / (1 + np.exp(-logits.astype(np.float64)))
        assert [h["score"] for h in hits] == pytest.approx([sigmoid[h["index"]] for h in hits], abs=1e-4)
        raw = c.post("/rerank", json={"query": QUERY, "texts": TEXTS, "raw_scores": True}).json()
        assert {h["index"]: h["score"] for h in raw} == pytest.approx(dict(enumerate(logits.tolist())), abs=1e-4)

        assert c.get("/info").json()["model_type"] == {"reranker": {"id2label": {"0": "LABEL_0"},
                                                                    "label2id": {"LABEL_0": 0}}}
        for path, body in [("/embed", {"inputs": "x"}), ("/similarity", {"inputs": {"source_sentence": "a",
                                                                                     "sentences": ["b"]}}),
                           ("/v1/embeddings", {"input": "x"}), ("/search", {"query": "x"})]:
            r = c.post(path, json=body)
            assert r.status_code == 424, (path, r.text)
            message = r.json()["error"]["message"] if path.startswith("/v1/") else r.json()["error"]
            assert "reranker" in message
        too_long = c.post("/rerank", json={"query": "word " * 40, "texts": ["x"], "truncate": False})
        assert too_long.status_code == 422 and "tokens" in too_long.json()["error"]


def _fake_client(kind: str) -> TestClient:
    from service.api.app import create_app

    registry = ModelRegistry()
    registry.add_in_process("fake", Engine(FakeBackend(kind=kind, max_seq_length=16)))
    return TestClient(create_app(Settings(backend="fake"), registry))


def test_rerank_runs_pairs_through_the_engine_queue():
    with _fake_client(CROSS_ENCODER) as c:
        # the fake cross-encoder's logit: distinct words shared by query and text, minus one
        texts = ["the cat", "a cat sat on the mat", "nothing here", "cat mat"]
        r = c.post("/rerank", json={"query": "the cat sat on a mat", "texts": texts, "raw_scores": True})
        assert r.status_code == 200, r.text
        # best first; a tie keeps the input order
        assert [(h["index"], h["score"]) for h in r.json()] == [(1, 5.0), (0, 1.0), (3, 1.0), (2, -1.0)]
        backend = c.app.state.registry.get().client.engine.backend
        assert sorted(backend.passes[-1]) == [11, 11, 11, 15]  # one pass of [CLS] query [SEP] text [SEP] rows
        # longer than max_seq_length: cut (longer side first) by default, refused with truncate=false
        long = " ".join(f"w{i}" for i in range(20))
        assert c.post("/rerank", json={"query": long, "texts": ["w1 w2"]}).status_code == 200
        assert c.post("/rerank", json={"query": long, "texts": ["w1"], "truncate": False}).status_code == 422
        assert c.post("/embed", json={"inputs": "x"}).status_code == 424


def test_a_reranker_default_gets_no_default_collection():
    """A cross-encoder makes no vectors: no 1-d default collection stamped by it, and the index routes
    that would embed say why instead of indexing scores."""
    with _fake_client(CROSS_ENCODER) as c:
        assert c.get("/collections").json()["collections"] == []
        assert c.get("/info").json()["index_documents"] == 0
        for method, path, body in [("POST", "/index/documents", {"documents": [{"id": "a", "text": "x"}]}),
                                   ("POST", "/search", {"query": "x"}), ("DELETE", "/index?confirm=true", None),
                                   ("DELETE", "/index/documents/a", None),
                                   ("POST", "/collections", {"name": "c"})]:
            r = c.request(method, path, json=body)
            assert r.status_code == 424 and "reranker" in r.json()["error"], (path, r.text)
        r = c.post("/collections", json={"name": "v", "vectors_only": True, "dimension": 3})
        assert r.status_code == 201, r.text  # client vectors still have a home
        added = c.post("/collections/v/documents", json={"documents": [{"id": "a", "vector": [1, 0, 0]}]})
        assert added.json()["added"] == 1


def test_rerank_keeps_cosine_for_an_embedding_model():
    with _fake_client("embedding") as c:
        texts = ["a b", "c d e"]
        hits = c.post("/rerank", json={"query": "a b", "texts": texts}).json()
        vectors = np.asarray(c.post("/embed", json={"inputs": ["a b", *texts]}).json())
        assert {h["index"]: h["score"] for h in hits} == pytest.approx(
            dict(enumerate((vectors[1:] @ vectors[0]).tolist())), abs=1e-6)
        assert hits[0]["index"] == 0
        assert "embedding" in c.get("/info").json()["model_type"]
