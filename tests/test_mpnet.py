"""Opt-in (`make mpnet` installs the weights; skipped without them): the real all-mpnet-base-v2, a 12-layer MPNet
with RoBERTa-style positions, exported and served exactly as sentence-transformers encodes it, and its int8 through
the cosine gate by the export's own search of what stays in float."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from core.default_model import mpnet_model_dir

pytestmark = pytest.mark.slow
TEXTS = ["A man is playing a guitar.", "Hi", "naïve café déjà-vu", "Stocks fell sharply on Monday. " * 60,
         "The quick brown fox jumps over the lazy dog."]


@pytest.fixture(scope="module")
def mpnet(tmp_path_factory):
    try:
        source = mpnet_model_dir()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    from core.encoder import SentenceEncoder
    from export.exporter import export_onnx

    out = tmp_path_factory.mktemp("mpnet") / "all-mpnet-base-v2"
    export_onnx(SentenceEncoder.from_pretrained(source), out, fp16=False)
    return source, out


def test_all_mpnet_base_v2_is_served_as_sentence_transformers_encodes_it(mpnet):
    from sentence_transformers import SentenceTransformer

    from service.settings import Settings
    from tests.conftest import LiveServer

    source, export = mpnet
    expected = SentenceTransformer(str(source), device="cpu").encode(TEXTS, normalize_embeddings=True)
    with LiveServer(Settings(model_dir=export)) as server:
        got = np.array(httpx.post(f"{server.url}/embed", json={"inputs": TEXTS}, timeout=120).json())
    assert got.shape == (len(TEXTS), 768)
    assert np.abs(got - expected).max() <= 1e-5
    from service.tokenization import Tokenizer

    assert Tokenizer(export).wordpiece is None  # <s> ... </s>: not BERT's pipeline, so tokenizers does it all


def test_its_int8_passes_the_gate_with_what_the_search_keeps_in_float(mpnet):
    from service.manifest import Manifest

    int8 = Manifest.load(mpnet[1]).variants["int8"]
    quality = int8["quality"]
    assert min(quality["mean_cosine_to_fp32"], quality["mean_cosine_to_fp32_long"]) >= 0.99
    assert 0 < len(int8["search"]["float_matmuls"]) < 72 / 4  # most GEMMs stay int8
