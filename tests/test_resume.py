"""Exact resume: N steps == k steps + resume + N−k steps (same losses, same weights), on the tiny model."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from training.config import make_config
from training.resume import CHECKPOINT, Checkpoint, TrainState, load_checkpoint, save_checkpoint
from training.trainer import train

TEXT = "text:corpus/wordnet-sentences.txt"
# 48 examples in batches of 16: 3 batches an epoch, so K=4 stops one batch into epoch 1 and N=7
# crosses another epoch boundary after the resume.
SMALL = {
    "simcse": dict(train_data=TEXT, objective={"pooling": "mean"}),
    "cosent": dict(train_data="stsb:train", warmup_ratio=0.1),
    "infocse": dict(train_data=TEXT, objective={"pooling": "mean", "stage1_steps": 2, "stage1_batch_size": 8}),
}
N, K = 7, 4
quiet = dict(log=lambda *_: None)
# checkpoint.pt's layout: one flat dict, as every version since exact resume has written it (so their checkpoints
# resume); a change here must keep reading the old one or refuse it by name
LAYOUT = {"objective", "optimizer", "scheduler", "scaler", "step", "epoch", "batches_in_epoch", "micro", "best_dev",
          "best_step", "initial_dev", "base_items", "best_rule", "rng", "config"}


def _config(method, tiny_model_dir, shared_data, tmp_path, **overrides):
    values = dict(base_model=str(tiny_model_dir), data_dir=shared_data, train_limit=48, batch_size=16, lr=1e-3,
                  epochs=10, max_steps=N, eval_every=100, max_seq_length=24, runs_dir=tmp_path / "runs",
                  models_dir=tmp_path / "models", **SMALL[method])
    values.update(overrides)
    return make_config(method, "quick", **values)


def _losses(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in rows if "loss" in r]


def _assert_same_run(a, b):
    assert _losses(a) == _losses(b)
    wa, wb = load_checkpoint(a / CHECKPOINT)["objective"], load_checkpoint(b / CHECKPOINT)["objective"]
    assert wa.keys() == wb.keys()
    different = [k for k in wa if not torch.equal(wa[k], wb[k])]
    assert not different, f"weights differ after resume: {different[:5]}"


def _split_run(cfg, run_dir, **resume_kwargs):
    first = train(cfg, run_dir, stop_at=K, **quiet)
    assert first.steps == K
    return train(dataclasses.replace(cfg, resume=run_dir), run_dir, **quiet, **resume_kwargs)


@pytest.mark.parametrize("method", ["simcse", "cosent"])
def test_resume_continues_exactly(method, tiny_model_dir, shared_data, tmp_path):
    cfg = _config(method, tiny_model_dir, shared_data, tmp_path)
    full = train(cfg, tmp_path / "full", **quiet)
    first = train(cfg, tmp_path / "split", stop_at=K, **quiet)
    state = load_checkpoint(tmp_path / "split" / CHECKPOINT)
    assert set(state) == LAYOUT
    assert (state["step"], state["epoch"], state["batches_in_epoch"]) == (K, 1, 1)
    assert state["rng"][0]["torch"].device.type == "cpu" and state["config"] == cfg.to_json()
    loaded = Checkpoint.load(tmp_path / "split" / CHECKPOINT)
    assert loaded.state == TrainState(K, 1, 1, K, state["best_dev"], 0, state["initial_dev"], None,
                                      "first evaluation: the base model")
    # a crash after the checkpoint leaves rows of steps the resumed run will redo
    with open(tmp_path / "split" / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": K + 1, "loss": 123.0}) + "\n")
    resumed = train(dataclasses.replace(cfg, resume=tmp_path / "split"), tmp_path / "split", **quiet)
    assert (first.steps, resumed.steps, full.steps) == (K, N, N)
    assert resumed.initial_dev == full.initial_dev and resumed.best_dev == full.best_dev
    _assert_same_run(tmp_path / "full", tmp_path / "split")


def test_infocse_resume_does_not_redo_stage1(tiny_model_dir, shared_data, tmp_path, monkeypatch):
    from training.objectives.infocse import InfoCSE

    # InfoCSE masks in collate: with a DataLoader worker, the worker's RNG must line up after the resume too
    cfg = _config("infocse", tiny_model_dir, shared_data, tmp_path, num_workers=1)
    train(cfg, tmp_path / "full", **quiet)
    train(cfg, tmp_path / "split", stop_at=K, **quiet)

    def no_stage1(*args, **kwargs):
        raise AssertionError("stage 1 ran again on resume")

    monkeypatch.setattr(InfoCSE, "_stage1", no_stage1)
    train(dataclasses.replace(cfg, resume=tmp_path / "split"), tmp_path / "split", **quiet)
    _assert_same_run(tmp_path / "full", tmp_path / "split")


def test_fp16_grad_scaler_state_is_checkpointed_and_resumed(tiny_model_dir, shared_data, tmp_path):
    # CPU autocast runs float16 too, so the GradScaler path is exercised without a GPU.
    cfg = _config("cosent", tiny_model_dir, shared_data, tmp_path, precision="fp16")
    train(cfg, tmp_path / "full", **quiet)
    train(cfg, tmp_path / "split", stop_at=K, **quiet)
    scaler = load_checkpoint(tmp_path / "split" / CHECKPOINT)["scaler"]
    assert scaler["scale"] > 1 and scaler["_growth_tracker"] == K  # K finite steps since the scale was set
    train(dataclasses.replace(cfg, resume=tmp_path / "split"), tmp_path / "split", **quiet)
    # a scaler restarted on resume would count only the N−K steps since the resume
    assert load_checkpoint(tmp_path / "split" / CHECKPOINT)["scaler"]["_growth_tracker"] == N
    _assert_same_run(tmp_path / "full", tmp_path / "split")


def test_changed_config_is_refused_unless_allowed(tiny_model_dir, shared_data, tmp_path):
    cfg = _config("cosent", tiny_model_dir, shared_data, tmp_path)
    run_dir = tmp_path / "run"
    train(cfg, run_dir, stop_at=2, **quiet)
    saved = (run_dir / "config.json").read_text()
    changed = dataclasses.replace(cfg, resume=run_dir, lr=5e-4, objective={"scale": 10.0})
    with pytest.raises(ValueError) as err:
        train(changed, run_dir, **quiet)
    assert "lr: 0.001 → 0.0005" in str(err.value) and "objective.scale: 20.0 → 10.0" in str(err.value)
    assert "allow_config_change" in str(err.value)
    assert (run_dir / "config.json").read_text() == saved  # the run's config is not overwritten

    result = train(dataclasses.replace(changed, allow_config_change=True), run_dir, **quiet)
    assert result.steps == N
    assert json.loads((run_dir / "config.json").read_text())["lr"] == 5e-4  # the config now in effect
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["config_changes"] for r in rows if "config_changes" in r] == [
        ["lr: 0.001 → 0.0005", "objective.scale: 20.0 → 10.0"]]


def test_cli_resume_takes_the_runs_config(tmp_path):
    from training.train import build_config

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cfg = make_config("cosent", "paper", data_dir=tmp_path / "data", lr=1e-5, objective={"scale": 10.0})
    (run_dir / "config.json").write_text(json.dumps(cfg.to_json()))

    resumed = build_config(["--method", "cosent", "--resume", str(run_dir)])
    assert resumed == dataclasses.replace(cfg, resume=run_dir)
    changed = build_config(["--method", "cosent", "--resume", str(run_dir), "--set", "lr=2e-5",
                            "--allow-config-change"])
    assert changed == dataclasses.replace(cfg, resume=run_dir, lr=2e-5, allow_config_change=True)
    with pytest.raises(SystemExit, match="cosent"):
        build_config(["--method", "simcse", "--resume", str(run_dir)])


def test_checkpoint_write_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / CHECKPOINT
    save_checkpoint({"step": 1}, path)

    def crash(obj, f):
        open(f, "wb").write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError):
        save_checkpoint({"step": 2}, path)
    assert load_checkpoint(path) == {"step": 1}


def test_training_loads_sdpa_attention(tiny_model_dir, shared_data, tmp_path, monkeypatch):
    import training.trainer as trainer

    loaded = []
    real = trainer.SentenceEncoder.from_pretrained

    def spy(*args, **kwargs):
        loaded.append(real(*args, **kwargs))
        return loaded[-1]

    monkeypatch.setattr(trainer.SentenceEncoder, "from_pretrained", spy)
    train(_config("cosent", tiny_model_dir, shared_data, tmp_path, max_steps=1), tmp_path / "run", **quiet)
    assert loaded[0].transformer.config._attn_implementation == "sdpa"


def test_checkpoints_load_without_unpickling_objects(tmp_path):
    """RNG states are stored as tensors, lists and numbers: the weights_only load restores every stream."""
    import random

    import numpy as np

    from training.resume import rng_state, set_rng_state

    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    np.random.standard_normal()  # numpy now holds a cached Gaussian: part of its state too
    save_checkpoint({"rng": [rng_state()], "weights": torch.ones(2)}, tmp_path / CHECKPOINT)
    expected = (torch.rand(3), np.random.standard_normal(3), random.random())

    set_rng_state(load_checkpoint(tmp_path / CHECKPOINT)["rng"][0])  # load_checkpoint: weights_only=True
    got = (torch.rand(3), np.random.standard_normal(3), random.random())
    assert torch.equal(got[0], expected[0]) and np.array_equal(got[1], expected[1]) and got[2] == expected[2]


def test_checkpoint_round_trip_and_refusals(tmp_path):
    """Checkpoint <-> checkpoint.pt: the TrainState and module states as saved; a checkpoint from before
    base_items / best_rule loads with their defaults; one without a config, or with keys this version does not
    know (a newer one's), is refused by name."""
    path = tmp_path / CHECKPOINT
    modules = dict(objective={"w": torch.ones(2)}, optimizer={"state": {}}, scheduler={"last_epoch": 3},
                   scaler={})
    state = TrainState(step=3, epoch=1, batches_in_epoch=2, micro=3, best_dev=1.5, best_step=2, initial_dev=1.0,
                       base_items=[1.0, 2.0], best_rule="margin")
    Checkpoint(state, **modules, config={"method": "simcse"}, rng=[{"torch": torch.zeros(3, dtype=torch.uint8)}]
               ).save(path)
    assert set(load_checkpoint(path)) == LAYOUT
    back = Checkpoint.load(path)
    assert back.state == state and back.config == {"method": "simcse"} and back.scheduler == {"last_epoch": 3}
    assert torch.equal(back.objective["w"], torch.ones(2)) and back.rng[0]["torch"].dtype == torch.uint8

    older = {k: v for k, v in load_checkpoint(path).items() if k not in ("base_items", "best_rule")}
    save_checkpoint(older, path)
    assert Checkpoint.load(path).state == TrainState(3, 1, 2, 3, 1.5, 2, 1.0, None, "")

    save_checkpoint({k: v for k, v in older.items() if k != "config"}, path)
    with pytest.raises(ValueError, match="predates exact resume"):
        Checkpoint.load(path)
    save_checkpoint({**older, "ema": {}}, path)
    with pytest.raises(ValueError, match=r"\['ema'\].*newer"):
        Checkpoint.load(path)
