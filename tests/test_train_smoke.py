"""Every METHOD end to end on the tiny model: loss goes down, the best checkpoint exports, the service serves it."""

import json

import numpy as np
import pytest
from fastapi.testclient import TestClient

from training.config import PRESETS, make_config
from training.objectives import METHODS
from training.train import train_and_export

# Small, repeated data so a few dozen steps visibly fit it.
SMOKE = {
    "simcse": dict(train_data="text:corpus/wordnet-sentences.txt", train_limit=64, batch_size=16, lr=1e-3),
    "conisi": dict(train_data="text:corpus/wordnet-sentences.txt", train_limit=64, batch_size=16, lr=1e-3),
    "infocse": dict(train_data="text:corpus/wordnet-sentences.txt", train_limit=64, batch_size=16, lr=1e-3,
                    objective={"stage1_steps": 3}),
    "cosent": dict(train_data="stsb:train", train_limit=64, batch_size=16, lr=1e-3, warmup_ratio=0.0),
    "cosent-cross": dict(train_data="stsb:train", train_limit=64, batch_size=16, lr=1e-3, warmup_ratio=0.0),
    "clsr": dict(train_data="stsb:train+dev", train_limit=64, batch_size=16, lr=1e-3, warmup_ratio=0.0,
                 schedule="constant"),
}


@pytest.mark.parametrize("preset", sorted(PRESETS))
@pytest.mark.parametrize("method", METHODS)
def test_presets_keep_the_models_served_length(method, preset):
    # The papers train on 32-token text (the objectives' max_length); the export must still serve
    # the model's own length (256 for the default), or the service would cut every long input.
    assert make_config(method, preset).max_seq_length is None


@pytest.mark.parametrize("method", METHODS)
def test_method_trains_and_exports_a_servable_model(method, tiny_model_dir, shared_data, tmp_path):
    cfg = make_config(method, "quick", base_model=str(tiny_model_dir), data_dir=shared_data, epochs=12,
                      max_steps=40, eval_every=20, max_seq_length=24, runs_dir=tmp_path / "runs",
                      models_dir=tmp_path / "models", **SMOKE[method])
    export_dir = train_and_export(cfg, log=lambda *_: None)

    run_dir = next((tmp_path / "runs").iterdir())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if "loss" in r]
    assert len(losses) == 40
    assert np.mean(losses[-8:]) < np.mean(losses[:8]), f"{method} loss did not go down: {losses}"
    devs = [r for r in rows if "dev" in r]
    assert [r["step"] for r in devs] == [0, 20, 40]
    assert (run_dir / "metrics.png").stat().st_size > 0 and (run_dir / "best").is_dir()

    manifest = json.loads((export_dir / "manifest.json").read_text())
    assert manifest["method"] == method
    assert {r["select"] for r in devs} == {manifest["training"]["select"]} == {"STS-B dev Spearman"}
    assert manifest["training"]["dev_score"] == pytest.approx(max(r["dev"] for r in devs), abs=1e-4)
    assert manifest["parity_max_abs_diff"] <= 1e-4
    assert manifest["max_seq_length"] == 24

    from service.settings import Settings
    from tests.inprocess import app_in_process

    with TestClient(app_in_process(Settings(model_dir=export_dir))) as client:
        if manifest.get("kind") == "cross-encoder":  # a pair scorer: /rerank (tests/test_cross_encoder.py)
            hits = client.post("/rerank", json={"query": "a trained model", "texts": ["ranks", "texts"]}).json()
            assert sorted(h["index"] for h in hits) == [0, 1]
            return
        r = client.post("/embed", json={"inputs": ["a trained model", "serves embeddings"]})
        assert r.status_code == 200
        vectors = np.array(r.json())
        assert vectors.shape == (2, manifest["dimension"])
        assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_resume_continues_a_run(tiny_model_dir, shared_data, tmp_path):
    from training.trainer import train

    common = dict(base_model=str(tiny_model_dir), data_dir=shared_data, eval_every=5, max_seq_length=24, epochs=20,
                  runs_dir=tmp_path / "runs", models_dir=tmp_path / "models", **SMOKE["cosent"])
    run_dir = tmp_path / "runs" / "r"
    first = train(make_config("cosent", "quick", max_steps=10, **common), run_dir, log=lambda *_: None)
    assert first.steps == 10
    # a longer run is a changed config (it stretches the LR schedule): allowed explicitly
    resumed = train(make_config("cosent", "quick", max_steps=15, resume=run_dir, allow_config_change=True, **common),
                    run_dir, log=lambda *_: None)
    assert resumed.steps == 15 and resumed.initial_dev == first.initial_dev
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == list(range(1, 16))  # steps 11–15 appended, none redone
    assert [r["step"] for r in rows if "dev" in r] == [0, 5, 10, 15]
    assert resumed.best_dev >= first.best_dev


def test_torchrun_two_processes(tiny_model_dir, shared_data, tmp_path):
    """DDP on CPU (gloo): two ranks, in-batch negatives gathered across them, rank 0 exports."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port=29533",
           "-m", "training.train", "--method", "simcse", "--base", str(tiny_model_dir),
           "--data-dir", str(shared_data), "--train-data", "text:corpus/wordnet-sentences.txt", "--max-steps", "6",
           "--set", "train_limit=64", "batch_size=8", "epochs=3", "eval_every=3", "max_seq_length=16",
           f"runs_dir='{tmp_path / 'runs'}'", f"models_dir='{tmp_path / 'models'}'"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                            env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "world 2" in result.stdout
    exports = list((tmp_path / "models").iterdir())
    assert len(exports) == 1  # only rank 0 exported
    rows = (next((tmp_path / "runs").iterdir()) / "metrics.jsonl").read_text().splitlines()
    assert sum('"loss"' in r for r in rows) == 6
