"""FaissIndex: exact inner-product search, replacement, deletion, persistence."""

import numpy as np
import pytest

from service.index import Document, FaissIndex


def unit(rows):
    rows = np.asarray(rows, dtype=np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def docs(*ids):
    return [Document(i, f"text {i}", {"i": i}) for i in ids]


def test_search_is_exact_inner_product_ranking():
    rng = np.random.default_rng(0)
    vectors = unit(rng.normal(size=(50, 8)))
    index = FaissIndex(8)
    index.add(docs(*[str(i) for i in range(50)]), vectors)
    queries = unit(rng.normal(size=(3, 8)))
    hits = index.search(queries, 5)
    for q, row in zip(queries, hits):
        expected = np.argsort(-(vectors @ q))[:5]
        assert [h.id for h in row] == [str(i) for i in expected]
        assert [h.score for h in row] == pytest.approx(sorted(vectors @ q, reverse=True)[:5], abs=1e-5)


def test_k_larger_than_index_and_empty_index():
    index = FaissIndex(2)
    assert index.search(unit([[1, 0]]), 3) == [[]]
    index.add(docs("a"), unit([[1, 0]]))
    assert [h.id for h in index.search(unit([[0, 1]]), 10)[0]] == ["a"]


def test_replace_and_delete():
    index = FaissIndex(2)
    index.add(docs("a", "b"), unit([[1, 0], [0, 1]]))
    index.add([Document("a", "new a")], unit([[0, 1]]))
    assert len(index) == 2
    top = index.search(unit([[0, 1]]), 2)[0]
    assert {h.id for h in top} == {"a", "b"} and all(h.score == pytest.approx(1.0) for h in top)
    assert index.delete(["a", "missing"]) == 1
    assert [h.id for h in index.search(unit([[1, 0]]), 5)[0]] == ["b"]
    index.clear()
    assert len(index) == 0


def test_wrong_shape_is_refused_without_side_effects():
    index = FaissIndex(4)
    with pytest.raises(ValueError):
        index.add(docs("a", "b"), unit([[1, 0, 0, 0]]))
    assert len(index) == 0


def test_persistence_survives_restart(tmp_path):
    index = FaissIndex(2, tmp_path / "idx")
    index.add(docs("a", "b", "c"), unit([[1, 0], [0, 1], [1, 1]]))
    index.delete(["b"])
    reopened = FaissIndex(2, tmp_path / "idx")
    assert len(reopened) == 2
    hit = reopened.search(unit([[1, 0]]), 1)[0][0]
    assert (hit.id, hit.text, hit.metadata) == ("a", "text a", {"i": "a"})
    reopened.add(docs("d"), unit([[-1, 0]]))  # new ids never collide with persisted ones
    assert {h.id for h in reopened.search(unit([[1, 0]]), 5)[0]} == {"a", "c", "d"}
    with pytest.raises(ValueError, match="dimension"):
        FaissIndex(3, tmp_path / "idx")


def test_a_crash_while_saving_keeps_the_previous_snapshot(tmp_path, monkeypatch):
    index = FaissIndex(2, tmp_path / "idx")
    index.add(docs("a"), unit([[1, 0]]))

    def crash(*_):
        raise OSError("disk gone")

    monkeypatch.setattr("service.index.os.replace", crash)
    with pytest.raises(OSError):
        index.add(docs("b"), unit([[0, 1]]))
    monkeypatch.undo()
    assert len(index) == 1  # the failed add is undone in memory too
    assert (tmp_path / "idx" / "index.npz.tmp").is_file()  # the half-done write is beside, not over it
    reopened = FaissIndex(2, tmp_path / "idx")
    assert [h.id for h in reopened.search(unit([[0, 1]]), 5)[0]] == ["a"]
