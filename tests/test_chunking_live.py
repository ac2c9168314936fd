"""Long documents in `python -m service` with the real default model (e2e, issue 41 point 1): a passage past the
model's 256-token window is found by a paraphrase of it, at its chunk's span, where truncation cannot see it;
replacing and deleting the document take all its chunks; /embed's chunks are the model's own windows."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import ServiceProcess

FILLER = ["The committee reviewed the annual budget and approved several minor amendments to it.",
          "Rain fell steadily over the valley for most of the afternoon and into the evening.",
          "Engineers replaced the old pumps at the water treatment plant during the spring.",
          "The museum extended its opening hours for the summer exhibition of modern prints.",
          "Local farmers reported a good harvest of wheat and barley after a mild winter.",
          "The library catalogue was moved to a new system that readers can search online."]
PASSAGE = "A young boy is riding a red bicycle down a steep hill near the harbour."
QUERY = "a child rides his bike downhill by the port"


def document(repeats: int = 6) -> str:
    """About 100 filler sentences (far past 256 tokens), the passage, then a few more."""
    return " ".join([*(FILLER * repeats * 3), PASSAGE, *FILLER[:3]])


@pytest.fixture(scope="module")
def service(default_export, tmp_path_factory):
    env = {"SEMBED_MODEL_DIR": str(default_export)}
    with ServiceProcess(env, tmp_path_factory.mktemp("chunks") / "service.log") as running, \
            httpx.Client(base_url=running.url, timeout=120) as client:
        yield client


def test_a_passage_past_the_window_is_found_by_a_paraphrase_at_its_span(service):
    c = service
    text = document()
    tokens = c.post("/tokenize", json={"inputs": text}).json()[0]  # what truncation embeds: the first window
    passage_at = text.index(PASSAGE)
    assert len(tokens) == 256 and tokens[-2]["stop"] < passage_at / 4  # far past the window
    others = [{"id": f"f{i}", "text": " ".join(FILLER[i:] + FILLER[:i]) * 3} for i in range(len(FILLER))]
    c.post("/collections", json={"name": "chunked"})
    c.post("/collections", json={"name": "cut"})
    added = c.post("/collections/chunked/documents", json={"documents": [{"id": "long", "text": text}, *others]})
    assert added.json()["added"] == 7, added.text
    c.post("/collections/cut/documents", json={"documents": [{"id": "long", "text": text}, *others],
                                              "chunking": False})

    hit = c.post("/collections/chunked/search", json={"query": QUERY, "k": 3}).json()["results"][0][0]
    assert hit["id"] == "long", hit
    assert hit["start"] <= passage_at and passage_at + len(PASSAGE) <= hit["end"]  # the chunk holding it
    chunk = text[hit["start"]: hit["end"]]
    window = c.post("/tokenize", json={"inputs": chunk}).json()[0]
    assert window[-2]["stop"] == len(chunk)  # the chunk fits the model's window: embedded whole
    truncated = c.post("/collections/cut/search", json={"query": QUERY, "k": 7}).json()["results"][0]
    score_cut = next(h["score"] for h in truncated if h["id"] == "long")
    assert hit["score"] > score_cut + 0.2, (hit["score"], score_cut)
    # /embed's chunks of the text are the ones stored: the search's best chunk is one of them, same vector
    chunks = c.post("/embed", json={"inputs": text, "chunking": True}).json()[0]
    assert (hit["start"], hit["end"]) in {(ch["start"], ch["end"]) for ch in chunks}
    assert chunks[-1]["end"] == len(text) and chunks[0]["start"] == 0


def test_replace_and_delete_take_every_chunk(service):
    c = service
    c.post("/collections", json={"name": "replaced"})
    c.post("/collections/replaced/documents", json={"documents": [{"id": "long", "text": document()},
                                                                   {"id": "other", "text": FILLER[0]}]})
    before = c.post("/collections/replaced/search", json={"query": QUERY, "k": 1}).json()["results"][0][0]
    assert before["id"] == "long"
    c.post("/collections/replaced/documents", json={"documents": [{"id": "long", "text": " ".join(FILLER * 20)}]})
    after = c.post("/collections/replaced/search", json={"query": QUERY, "k": 2, "chunks": True}).json()["results"][0]
    long = next(h for h in after if h["id"] == "long")
    assert long["score"] < before["score"] - 0.2  # no chunk of the old text is left to find
    assert all(PASSAGE not in long["text"][ch["start"]: ch["end"]] for ch in long["chunks"])
    assert c.delete("/collections/replaced/documents/long").json()["total"] == 1
    assert [h["id"] for h in c.post("/collections/replaced/search", json={"query": QUERY, "k": 5}).json()[
        "results"][0]] == ["other"]
