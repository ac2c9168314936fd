"""The saved encoder is a real sentence-transformers directory, and we load any such directory as ST does."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from core.encoder import SentenceEncoder

st = pytest.importorskip("sentence_transformers")

TEXTS = ["A man is playing a guitar.", "Hi", "Stocks fell sharply on Monday after the announcement.",
         " ".join(["long"] * 80)]  # longer than max_seq_length: truncation must agree too


def _st_encode(path, normalize=False):
    model = st.SentenceTransformer(str(path), device="cpu")
    return model, model.encode(TEXTS, convert_to_numpy=True, normalize_embeddings=normalize)


HEADS = {
    "none": lambda: None,
    "linear-tanh": lambda: nn.Sequential(nn.Linear(32, 32), nn.Tanh()),  # SimCSE's MLP kept at test time
    "mlp": lambda: nn.Sequential(nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 8)),  # CLSR's e
    "chain": lambda: nn.Sequential(nn.Linear(32, 12), nn.Sequential(nn.Linear(12, 8), nn.ReLU())),
}


@pytest.mark.parametrize("pooling", ["mean", "cls", "first_last_avg"])
@pytest.mark.parametrize("head", sorted(HEADS))
def test_saved_directory_loads_in_sentence_transformers_identically(tiny_model_dir, tmp_path, pooling, head):
    torch.manual_seed(1)
    enc = SentenceEncoder.from_pretrained(tiny_model_dir, pooling=pooling, max_seq_length=24)
    enc.head = HEADS[head]()
    enc.save_pretrained(tmp_path / "best")

    files = {p.relative_to(tmp_path / "best").as_posix() for p in (tmp_path / "best").rglob("*") if p.is_file()}
    assert {"modules.json", "config_sentence_transformers.json", "sentence_bert_config.json", "config.json",
            "model.safetensors", "tokenizer.json"} <= files
    assert not [f for f in files if f.endswith((".pt", ".bin", ".pkl", ".pickle"))], files
    modules = json.loads((tmp_path / "best" / "modules.json").read_text())
    kinds = [m["type"].rsplit(".", 1)[-1] for m in modules]
    assert kinds[0] == "Transformer" and kinds[-1] == "Normalize"
    assert kinds.count("Dense") == {"none": 0, "linear-tanh": 1, "mlp": 2, "chain": 2}[head]

    model, got = _st_encode(tmp_path / "best")
    assert model.max_seq_length == 24
    expected = enc.encode(TEXTS)  # our encoder normalises, so the directory ends in Normalize
    assert got.shape == expected.shape == (len(TEXTS), enc.dim)
    np.testing.assert_allclose(got, expected, atol=2e-6)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)

    # and back: our loader reads what it wrote (pooling, head, length, normalize)
    again = SentenceEncoder.from_pretrained(tmp_path / "best")
    assert (again.pooling, again.max_seq_length, again.dim, again.normalize) == (pooling, 24, enc.dim, True)
    np.testing.assert_allclose(again.encode(TEXTS, normalize=False), enc.encode(TEXTS, normalize=False), atol=1e-6)


def test_a_head_that_is_not_dense_layers_is_refused(tiny_encoder, tmp_path):
    tiny_encoder.head = nn.Sequential(nn.Linear(32, 32), nn.BatchNorm1d(32))
    with pytest.raises(ValueError, match="BatchNorm1d"):
        tiny_encoder.save_pretrained(tmp_path / "best")


def test_the_embedded_default_model_loads_as_sentence_transformers_loads_it(default_model_dir):
    ours = SentenceEncoder.from_pretrained(default_model_dir)
    assert (ours.pooling, ours.max_seq_length, ours.normalize, ours.head) == ("mean", 256, True, None)
    model, expected = _st_encode(default_model_dir)
    np.testing.assert_allclose(ours.encode(TEXTS[:3]), expected[:3], atol=2e-6)


def test_overriding_a_trained_models_pooling_is_said(default_model_dir, caplog):
    """all-MiniLM-L6-v2 was trained with mean pooling: CLS pooling (a `paper` preset's, `--objective pooling=cls`)
    gives it other vectors to start from, which the log says; its own pooling, or a plain HF checkpoint, is
    silent."""
    def ours() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "sembed.encoder"]

    with caplog.at_level("WARNING", logger="sembed.encoder"):
        assert SentenceEncoder.from_pretrained(default_model_dir, pooling="mean").pooling == "mean"
        assert not ours()
        assert SentenceEncoder.from_pretrained(default_model_dir, pooling="cls").pooling == "cls"
    (message,) = ours()
    assert "was trained with mean pooling: with cls pooling its vectors are not the ones" in message


@pytest.fixture
def st_saved_dir(tiny_model_dir, tmp_path):
    """A directory written by sentence-transformers itself: CLS pooling, a Dense head, no Normalize."""
    from sentence_transformers.base.modules import Dense, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    torch.manual_seed(2)
    modules = [Transformer(str(tiny_model_dir), max_seq_length=20), Pooling(32, pooling_mode="cls"),
               Dense(32, 10, activation_function=nn.Tanh())]
    st.SentenceTransformer(modules=modules, device="cpu").save(str(tmp_path / "st"))
    return tmp_path / "st"


def test_a_directory_sentence_transformers_wrote_loads_with_its_modules(st_saved_dir):
    ours = SentenceEncoder.from_pretrained(st_saved_dir)
    assert (ours.pooling, ours.max_seq_length, ours.normalize, ours.dim) == ("cls", 20, False, 10)
    _, expected = _st_encode(st_saved_dir)  # unnormalised: this model has no Normalize module
    np.testing.assert_allclose(ours.encode(TEXTS), expected, atol=2e-6)


def test_the_exporter_serves_a_sentence_transformers_directory_as_it_encodes(st_saved_dir, tmp_path):
    import onnxruntime as ort

    from export.__main__ import main as export_main

    assert export_main(["--model", str(st_saved_dir), "--out", str(tmp_path / "export"), "--no-int8"]) == 0
    manifest = json.loads((tmp_path / "export" / "manifest.json").read_text())
    assert (manifest["pooling"], manifest["max_seq_length"], manifest["dimension"]) == ("cls", 20, 10)
    assert manifest["normalize"] is False
    ours = SentenceEncoder.from_pretrained(st_saved_dir)
    batch = ours.tokenize(TEXTS)
    session = ort.InferenceSession(str(tmp_path / "export" / "model.onnx"), providers=["CPUExecutionProvider"])
    feeds = {i.name: batch[i.name].numpy().astype(np.int64) for i in session.get_inputs()}
    raw = session.run(["embedding_raw"], feeds)[0]
    _, expected = _st_encode(st_saved_dir)
    np.testing.assert_allclose(raw, expected, atol=1e-5)


class _Tripwire:
    """Unpickling this calls Path.touch on `path`: a stand-in for code a pickle can run."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def test_a_pickled_head_is_refused_without_being_unpickled(tiny_encoder, tmp_path):
    model_dir = tmp_path / "old-best"  # the layout before directories were sentence-transformers ones
    tiny_encoder.transformer.save_pretrained(model_dir)
    tiny_encoder.tokenizer.save_pretrained(model_dir)
    torch.save(_Tripwire(tmp_path / "ran"), model_dir / "head.pt")
    with pytest.raises(ValueError, match="pickled head"):
        SentenceEncoder.from_pretrained(model_dir)
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("pooling,head", [("mean", "none"), ("cls", "mlp"), ("first_last_avg", "linear-tanh")])
def test_our_checkpoint_exports_to_what_sentence_transformers_loads_from_it(tiny_model_dir, tmp_path, pooling, head):
    """The whole chain a trained run goes through: our checkpoint directory, loaded by sentence-transformers,
    gives the vectors the served ONNX export gives (heads and pooling inside the graph)."""
    import onnxruntime as ort

    from export.__main__ import main as export_main

    torch.manual_seed(2)
    enc = SentenceEncoder.from_pretrained(tiny_model_dir, pooling=pooling, max_seq_length=24)
    enc.head = HEADS[head]()
    enc.save_pretrained(tmp_path / "best")
    assert export_main(["--model", str(tmp_path / "best"), "--out", str(tmp_path / "export"), "--no-int8",
                        "--no-fp16"]) == 0
    batch = SentenceEncoder.from_pretrained(tmp_path / "best").tokenize(TEXTS)
    session = ort.InferenceSession(str(tmp_path / "export" / "model.onnx"), providers=["CPUExecutionProvider"])
    feeds = {i.name: batch[i.name].numpy().astype(np.int64) for i in session.get_inputs()}
    served = session.run(["embedding"], feeds)[0]
    _, expected = _st_encode(tmp_path / "best")  # the directory ends in Normalize: unit vectors
    np.testing.assert_allclose(served, expected, atol=1e-5)
