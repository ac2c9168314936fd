"""Sparse (SPLADE) vectors in a collection, end to end (issue 41): `python -m service` serving the real default
model beside a tiny random-weight SPLADE export (tests/tiny_models.py), a collection created with that
`sparse_model`; every write embeds each chunk with it too, mode sparse ranks by the dot product with the query's
sparse vector (SparseEncoder's, within the export's tolerance), hybrid fuses it, deletes and replaces remove old
vectors, the 422s name the options, and after kill -9 the restarted service (the log's replay) ranks every
search as before."""

from __future__ import annotations

import os
import signal

import httpx
import numpy as np
import pytest

from tests.conftest import ServiceProcess, wait_until
from tests.test_hybrid_search import children, gone
from tests.tiny_models import build_splade

# Each part's code opens its ticket, as the query names it first: a random-weight model's token activations follow
# the token and its position, so the ticket holding the query's rare code is the one sharing its activations.
CODES = ["QX9981", "ZB4410", "KL7723", "MV3056", "TR8890", "PD1167", "WN5528", "HC2294"]
TICKETS = {f"part-{c}": f"{c} reordered for the coffee machine in the lobby" for c in CODES}
LONG = ("The printers on floor two jam every morning.\n\n" * 3 + "XR5512 fused the toner and needs a new drum.\n\n"
        + "Facilities will look at the wiring next week.\n\n" * 2)
TOLERANCE = 1e-4  # the ONNX graph against sentence-transformers (test_sparse_service)


@pytest.fixture(scope="module")
def splade(tmp_path_factory):
    """Two tiny SPLADEs (other random weights): their source directories, and the folder of their exports
    (`splade`, `splade-b`: what a reload may load)."""
    from core.sparse import SpladeEncoder
    from export.sparse import export_sparse

    root = tmp_path_factory.mktemp("splade")
    sources = [build_splade(root / f"src-{seed}", seed=seed) for seed in (0, 1)]
    for source, name in zip(sources, ("splade", "splade-b")):
        export_sparse(SpladeEncoder.from_pretrained(source), root / "exports" / name)
    return sources, root / "exports"


def reference(source, texts: list[str]) -> np.ndarray:
    from sentence_transformers import SparseEncoder

    return SparseEncoder(str(source), device="cpu").encode(texts, convert_to_sparse_tensor=False).numpy()


def test_sparse_collections_rank_by_splade_fuse_refuse_and_survive_kill_9(default_export, splade, tmp_path_factory):
    (source, other), exports = splade
    folder = tmp_path_factory.mktemp("sparse-search")
    env = {"SEMBED_MODELS": f"minilm={default_export},splade={exports / 'splade'}", "SEMBED_MODELS_ROOT": str(exports),
           "SEMBED_INDEX_PATH": str(folder / "index"), "SEMBED_ADMIN_API_KEYS": "admin-key"}
    admin = {"Authorization": "Bearer admin-key"}
    with ServiceProcess(env, folder / "first.log") as service, httpx.Client(base_url=service.url, timeout=60) as c:
        def refused(reply, *words):
            assert reply.status_code == 422, reply.text
            assert all(w in reply.json()["error"] for w in words), reply.json()
        refused(c.post("/collections", json={"name": "x", "sparse_model": "nope"}), "'nope'", "splade")
        refused(c.post("/collections", json={"name": "x", "sparse_model": "minilm"}), "not a sparse model", "splade")
        created = c.post("/collections", json={"name": "parts", "sparse_model": "splade"})
        assert created.status_code == 201, created.text
        info = c.get("/collections/parts").json()
        assert info["sparse_model"]["name"] == "splade" and len(info["sparse_model"]["sha256"]) == 64
        assert info["sparse_dimension"] == 30522 and info["lexical"] is False
        assert c.post("/collections", json={"name": "plain"}).json()["sparse_model"] is None

        documents = [{"id": i, "text": t, "metadata": {"n": n}} for n, (i, t) in enumerate(TICKETS.items())]
        documents.append({"id": "long", "text": LONG, "metadata": {"n": -1}})
        written = c.post("/collections/parts/documents",
                         json={"documents": documents, "chunking": {"size": 16, "overlap": 0}})
        assert written.status_code == 200 and written.json()["added"] == len(documents), written.text

        def search(query, mode: str = "sparse", k: int = 3, name: str = "parts", **body):
            return c.post(f"/collections/{name}/search", json={"query": query, "k": k, "mode": mode, **body})

        def hits(query, mode: str = "sparse", **body) -> list[dict]:
            reply = search(query, mode, **body)
            assert reply.status_code == 200, reply.text
            return reply.json()["results"][0]

        for code in CODES:  # the ticket holding the query's rare code first, by SPLADE's dot product
            found = hits(f"{code} order status")
            assert found[0]["id"] == f"part-{code}"
            texts = [TICKETS[h["id"]] for h in found if h["id"] != "long"]
            expected = reference(source, texts) @ reference(source, [f"{code} order status"])[0]
            assert np.allclose([h["score"] for h in found if h["id"] != "long"], expected, atol=TOLERANCE * 10)
        # a chunk of a long document: the hit is the document at the chunk holding the code
        [best] = hits("XR5512 drum", k=1)
        assert best["id"] == "long" and LONG[best["start"]: best["end"]].startswith("XR5512")
        chunk = reference(source, [LONG[best["start"]: best["end"]]])[0]
        assert best["score"] == pytest.approx(float(chunk @ reference(source, ["XR5512 drum"])[0]), abs=1e-3)
        # hybrid: dense and sparse fused (no lexical index here); with the dense weight 0, sparse alone decides
        assert hits("QX9981 order status", "hybrid", fusion={"dense_weight": 0})[0]["id"] == "part-QX9981"
        fused = hits("QX9981 order status", "hybrid", fusion={"k": 1, "sparse_weight": 2, "candidates": 20})
        assert len(fused) == 3 and fused[0]["score"] > 1.0  # first by sparse: 2 / (1 + 1), and dense's share
        assert hits("QX9981 order", filter={"n": {"$gt": 0}})[0]["id"] != "part-QX9981"  # filters apply

        refused(search("QX9981", "semantic"), "'dense'", "'lexical'", "'sparse'", "'hybrid'")
        refused(search("QX9981", name="plain"), "'plain' has no sparse vectors", "sparse_model")
        refused(search("QX9981", "hybrid", name="plain"), "no lexical index and no sparse vectors")
        refused(c.post("/search", json={"query": "QX9981", "mode": "sparse"}), "default collection keeps no sparse")
        refused(search("QX9981", "hybrid", fusion={"dense_weight": 0, "lexical_weight": 0, "sparse_weight": 0}),
                "cannot all be 0")
        refused(search("QX9981", "hybrid", fusion={"sparse_weight": -1}), "sparse_weight")
        refused(c.post("/collections/parts/search", json={"vector": [0.1] * 384, "mode": "sparse"}),
                "give query (text), not vector")

        # deletes and replaces take the old sparse vectors away
        assert c.delete("/collections/parts/documents/part-ZB4410").status_code == 200
        assert "part-ZB4410" not in [h["id"] for h in hits("ZB4410 order status", k=10)]
        replaced = {"id": "part-KL7723", "text": "TR8890 spare fitted, the old part is gone"}
        acked = c.post("/collections/parts/documents", json={"documents": [replaced]})
        assert acked.status_code == 200
        assert hits("KL7723 order status")[0]["id"] != "part-KL7723"

        def answers() -> list:
            out = []
            for body in ({"query": [f"{code} order status" for code in CODES], "mode": "sparse"},
                         {"query": ["XR5512 drum", "coffee machine"], "mode": "sparse", "chunks": True},
                         {"query": "TR8890 spare", "mode": "hybrid", "fusion": {"k": 5}}):
                reply = c.post("/collections/parts/search", json={"k": 5, "include": [], **body})
                out.append(reply.json()["results"])
            return out

        before = answers()
        # re-embedding (a dense model change) makes the sparse vectors again too: the same models, the same answers
        reembedded = c.post("/admin/collections/parts/reembed", json={"model": "minilm"}, headers=admin)
        assert reembedded.status_code == 200 and reembedded.json()["count"] == len(documents) - 1, reembedded.text
        assert c.get("/collections/parts").json()["sparse_model"] == info["sparse_model"]
        assert answers() == before
        acked = c.post("/collections/parts/documents", json={"documents": [replaced]})  # the last write: acknowledged
        processes = [service.proc.pid, *children(service.proc.pid)]
        os.kill(service.proc.pid, signal.SIGKILL)  # the supervisor: its children die with it (PR_SET_PDEATHSIG)
        wait_until(lambda: all(gone(p) for p in processes), 60, what="every process of the killed service to end")

    with ServiceProcess(env, folder / "second.log") as service, httpx.Client(base_url=service.url, timeout=60) as c:
        info = c.get("/collections/parts").json()
        assert info["sparse_model"]["name"] == "splade" and info["count"] == len(documents) - 1
        assert info["sequence"] == acked.json()["sequence"]  # every acknowledged write is back
        after = answers()
        assert [[[h["id"] for h in row] for row in part] for part in after] == \
            [[[h["id"] for h in row] for row in part] for part in before]
        assert after == before  # scores and spans too: the same vectors, summed in the same order

        # a reload of the sparse model with reembed: the collection's sparse vectors are the new model's
        reloaded = c.post("/admin/models/splade/reload", json={"export": "splade-b", "reembed": True}, headers=admin)
        assert reloaded.status_code == 200, reloaded.text
        now = c.get("/collections/parts").json()["sparse_model"]
        assert now["name"] == "splade" and now["sha256"] != info["sparse_model"]["sha256"]
        for code in CODES[:3]:
            query = f"{code} order status"
            found = [h for h in c.post("/collections/parts/search", json={"query": query, "mode": "sparse",
                                                                          "k": 20}).json()["results"][0]
                     if h["id"].startswith("part-")]
            texts = {**TICKETS, "part-KL7723": replaced["text"]}
            expected = reference(other, [texts[h["id"]] for h in found]) @ reference(other, [query])[0]
            assert np.allclose([h["score"] for h in found], expected, atol=TOLERANCE * 10)
        assert c.post("/collections/parts/documents", json={"documents": [replaced]}).status_code == 200
