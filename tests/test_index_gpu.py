"""The GPU path's selection logic, with faiss monkeypatched (no GPU here: the real GPU path never runs).

A fake GPU: faiss reports StandardGpuResources and one GPU, and index_cpu_to_gpu returns a CPU clone
wrapped to count its searches, so what runs "on the GPU" is the same FAISS code on the CPU.
"""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from service.index import CollectionSpec, Document, LocalIndex, SearchParams, gpu
from service.index.vectors import VectorSet
from service.settings import Settings

DIM = 16


def unit(rows):
    rows = np.asarray(rows, dtype=np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


class FakeGpuIndex:
    """What index_cpu_to_gpu would return: here a CPU clone that counts its searches."""

    def __init__(self, index):
        self.index = faiss.clone_index(index)
        self.searches = 0

    def add_with_ids(self, x, ids):
        self.index.add_with_ids(x, ids)

    def search(self, x, k, params=None):
        self.searches += 1
        return self.index.search(x, k, params=params)


@pytest.fixture
def fake_gpu(monkeypatch):
    copies: list[FakeGpuIndex] = []

    def index_cpu_to_gpu(res, device, index):
        assert device == 0 and isinstance(res, FakeResources)
        copies.append(FakeGpuIndex(index))
        return copies[-1]

    class FakeResources:
        pass

    monkeypatch.setattr(faiss, "StandardGpuResources", FakeResources, raising=False)
    monkeypatch.setattr(faiss, "get_num_gpus", lambda: 1)
    monkeypatch.setattr(faiss, "index_cpu_to_gpu", index_cpu_to_gpu, raising=False)
    monkeypatch.setattr(gpu, "_resources", None)
    return copies


@pytest.fixture
def no_gpu(monkeypatch):
    """faiss-cpu as installed here (no StandardGpuResources); copying would be a bug."""
    def refuse(*args):
        raise AssertionError("index_cpu_to_gpu called without a GPU")

    monkeypatch.delattr(faiss, "StandardGpuResources", raising=False)
    monkeypatch.setattr(faiss, "index_cpu_to_gpu", refuse, raising=False)
    monkeypatch.setattr(gpu, "_resources", None)


def filled(index_type, n=3000, gpu_mode="auto", seed=0):
    x = unit(np.random.default_rng(seed).normal(size=(n, DIM)))
    vs = VectorSet(DIM, index_type, background=False, gpu_mode=gpu_mode)
    vs.append(x)
    vs.build_now()
    return vs, x


@pytest.mark.parametrize("index_type", ["Flat", "IVF4,SQ8", "HNSW16"])
def test_without_a_gpu_everything_stays_on_the_cpu(no_gpu, index_type):
    assert not gpu.available() and gpu.resources("auto") is None
    vs, x = filled(index_type)
    assert vs._gpu is None and vs._gpu_ann is None
    scores, slots = vs.search(x[:3], 5)
    assert slots[:, 0].tolist() == [0, 1, 2]
    vs.close()


@pytest.mark.parametrize("index_type", ["Flat", "IVF4,SQ8"])
def test_a_reported_gpu_gets_a_copy_that_answers_unfiltered_searches(fake_gpu, index_type):
    assert gpu.available()
    vs, x = filled(index_type)
    cpu, _ = filled(index_type, gpu_mode="off")
    assert len(fake_gpu) == 1 and vs._gpu_ann is fake_gpu[0]
    queries = unit(np.random.default_rng(1).normal(size=(20, DIM)))
    scores, slots = vs.search(queries, 10, nprobe=2 if index_type != "Flat" else None)
    want_scores, want_slots = cpu.search(queries, 10, nprobe=2 if index_type != "Flat" else None)
    assert fake_gpu[0].searches == 1
    assert np.array_equal(slots, want_slots) and np.allclose(scores, want_scores, atol=1e-5)
    vs.search(queries, 10, allowed=np.arange(0, 3000, 2))  # filtered: the CPU answers
    assert fake_gpu[0].searches == 1

    dead = np.arange(0, 3000, 3)[:400]  # tombstones: asked for k + dead, the dead dropped
    vs.kill(dead)
    cpu.kill(dead)
    scores, slots = vs.search(queries, 10)
    want_scores, want_slots = cpu.search(queries, 10)
    assert fake_gpu[0].searches == 2 and not set(slots.ravel().tolist()) & set(dead.tolist())
    assert np.array_equal(slots, want_slots)
    vs.append(unit(np.ones((1, DIM))))  # not copied yet: the exact pass over the tail finds it
    assert vs.search(unit(np.ones((1, DIM))), 1)[1][0, 0] == 3000
    vs.kill(np.arange(1, 3000, 3))  # past a fifth dead: the copy is rebuilt from the live slots
    vs.build_now()
    assert len(fake_gpu) == 2 and vs._gpu_ann is fake_gpu[1] and vs._dead_covered == 0
    vs.close()
    cpu.close()


def test_hnsw_is_never_copied_and_off_means_off(fake_gpu):
    vs, _ = filled("HNSW16")
    off, _ = filled("Flat", gpu_mode="off")
    assert fake_gpu == [] and vs._gpu is None and off._gpu is None
    with pytest.raises(ValueError):
        gpu.resources("cuda")
    vs.close()
    off.close()


def test_a_copy_faiss_cannot_make_leaves_the_cpu_answering(fake_gpu, monkeypatch):
    def cannot(res, device, index):
        raise RuntimeError("GPU IVFPQ needs 8 bits per code")

    monkeypatch.setattr(faiss, "index_cpu_to_gpu", cannot, raising=False)
    vs, x = filled("IVF4,SQ8")
    assert vs._gpu is None and vs._gpu_ann is None
    assert vs.search(x[:1], 1)[1][0, 0] == 0
    vs.close()


def test_the_setting_reaches_the_collections(fake_gpu, monkeypatch, tmp_path):
    monkeypatch.setenv("SEMBED_INDEX_GPU", "off")
    assert Settings().index_gpu == "off"
    for mode, copied in (("off", False), ("auto", True)):
        index = LocalIndex(tmp_path / mode, background=False, gpu=mode)
        index.create_collection(CollectionSpec("c", DIM))
        index.upsert("c", [Document(f"d{i}") for i in range(50)], unit(np.eye(50, DIM) + 0.01))
        index._collections["c"].vectors.build_now()
        assert (index._collections["c"].vectors._gpu_ann is not None) == copied
        assert index.search("c", unit(np.eye(1, DIM) + 0.01), SearchParams(k=1))[0][0].id == "d0"
        index.close()


@pytest.mark.skipif(not (hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0),
                    reason="needs a FAISS GPU build and a GPU (make venv-gpu on a GPU machine)")
@pytest.mark.parametrize("index_type", ["Flat", "IVF64,SQ8", "IVF64,PQ8"])
def test_on_a_real_gpu_the_copy_answers_as_the_cpu_does(index_type):
    """No fake: FAISS's own GPU index, against the same collection searched on the CPU."""
    assert gpu.available()
    vs, x = filled(index_type, n=20000)
    cpu, _ = filled(index_type, n=20000, gpu_mode="off")
    ann = vs._gpu_ann
    inner = faiss.downcast_index(ann.index) if isinstance(ann, faiss.IndexIDMap) else ann
    assert type(inner).__name__.startswith("GpuIndex"), type(inner)
    queries = unit(np.random.default_rng(1).normal(size=(200, DIM)))
    nprobe = None if index_type == "Flat" else 8
    scores, slots = vs.search(queries, 10, nprobe=nprobe)
    want_scores, want_slots = cpu.search(queries, 10, nprobe=nprobe)
    overlap = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(slots.tolist(), want_slots.tolist())])
    assert overlap >= 0.99 and np.allclose(np.sort(scores, axis=1), np.sort(want_scores, axis=1), atol=1e-2)
    dead = np.arange(0, 20000, 7)  # tombstones: asked for k + dead, the dead dropped on the GPU path too
    vs.kill(dead)
    _, slots = vs.search(queries, 10, nprobe=nprobe)
    assert not set(slots.ravel().tolist()) & set(dead.tolist()) and (slots >= 0).all()
    vs.close()
    cpu.close()


def test_the_gpu_index_bench_compares_the_two_placements_for_real():
    """`python -m benchmarks.index_gpu` on a tiny set: here both placements are the CPU, and agree."""
    from benchmarks.index_gpu import compare

    rng = np.random.default_rng(0)
    r = compare("IVF16,SQ8", unit(rng.normal(size=(2000, DIM))), unit(rng.normal(size=(20, DIM))))
    assert r["off"]["on"] == "CPU" and r["auto"]["on"] == ("GPU" if gpu.available() else "CPU")
    assert r["overlap"] >= 0.99 and r["off"]["search_ms"] > 0 and r["auto"]["build_s"] > 0
