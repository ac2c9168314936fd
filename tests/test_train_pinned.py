"""The trainer's losses, step by step, on a fixed seed: pinned from the loop as it was before issue 42's refactor.

Each run is tiny (the 2-layer BERT of conftest, batches of 8, 5 steps crossing an epoch boundary, an evaluation
every 2 steps) and covers one path of the loop: the plain step, warm-up with fp16's GradScaler, GradCache, a
pooling override (step 0 is not the base as saved, which selection scores too), a frozen encoder (CLSR) and
InfoCSE's stage 1 before its stage 2 (with the encoder frozen in stage 1, and trained in micro-batches of 3, 3
and 2; both recorded from the loop before the refactor too). A change to the batch order, the RNG streams, the
schedule, clipping, loss scaling or what runs between steps moves these values far beyond the tolerance, which
only absorbs float rounding that differs between CPUs.
"""

from __future__ import annotations

import json

import pytest
import torch

from training.config import make_config
from training.selection import make_evaluator
from training.trainer import train

TEXT = "text:corpus/wordnet-sentences.txt"
RUNS = {
    "simcse": ("simcse", dict(train_data=TEXT, objective={"pooling": "mean"})),
    "simcse-cls": ("simcse", dict(train_data=TEXT, objective={"pooling": "cls"})),
    "cosent-fp16": ("cosent", dict(train_data="stsb:train", warmup_ratio=0.4, precision="fp16")),
    "cosent-gradcache": ("cosent", dict(train_data="stsb:train", grad_cache=3)),
    "clsr": ("clsr", dict(train_data="stsb:train+dev", objective={"hidden_dim": 16, "out_dim": 16, "proj_dim": 16})),
    "infocse": ("infocse", dict(train_data=TEXT, objective={"pooling": "mean", "stage1_steps": 3,
                                                             "stage1_batch_size": 8, "stage1_micro_batch_size": 4,
                                                             "stage1_warmup_ratio": 0.4})),
    # stage 1 training the encoder too, in micro-batches of 3, 3 and 2, warm-up then linear decay over 5 steps
    "infocse-encoder": ("infocse", dict(train_data=TEXT, objective={
        "pooling": "mean", "stage1_steps": 5, "stage1_batch_size": 8, "stage1_micro_batch_size": 3,
        "stage1_warmup_ratio": 0.5, "stage1_train_encoder": True})),
}
PINNED = {
    "simcse": [1.2634049654006958, 0.7914481163024902, 0.47753965854644775, 0.27407562732696533, 0.1140129417181015],
    "simcse-cls": [2.770759105682373, 2.3785533905029297, 1.9310449361801147, 2.610192060470581, 2.4104630947113037],
    "cosent-fp16": [3.4434943199157715, 3.313220500946045, 3.5095572471618652, 3.2581980228424072, 3.2170333862304688],
    "cosent-gradcache": [
        3.426211357116699, 3.5079784393310547, 3.3268580436706543, 3.290430784225464, 3.249640464782715,
    ],
    "clsr": [2.5264129638671875, 2.3401434421539307, 2.4788336753845215, 2.3917763233184814, 2.2323055267333984],
    "infocse-encoder": [
        1.3203226327896118, 0.6474598050117493, 0.535016655921936, 0.3250158131122589, 0.12492632865905762,
    ],
    "infocse": [1.2487086057662964, 0.715981125831604, 0.4992353022098541, 0.2890430986881256, 0.12307799607515335],
}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One thread: the same reduction order on every run (and no spin-wait contention on a shared machine)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def run_losses(name: str, model_dir, data_dir, tmp_path) -> list[list[float]]:
    """[step, loss] for each step of the named tiny run."""
    method, values = RUNS[name]
    dev = tmp_path / "dev.tsv"
    dev.write_text("A man plays a guitar.\tA man is playing a guitar.\t4.8\n"
                   "Stocks fell on Monday.\tThe cat sleeps on the mat.\t0.2\n"
                   "She baked bread.\tShe made bread at home.\t3.9\n"
                   "Two children run.\tRain is expected tonight.\t0.5\n")
    cfg = make_config(method, "quick", base_model=str(model_dir), data_dir=data_dir, train_limit=24, batch_size=8,
                      lr=1e-3, epochs=10, max_steps=5, eval_every=2, max_seq_length=24, seed=7,
                      runs_dir=tmp_path / "runs", models_dir=tmp_path / "models", **values)
    run_dir = tmp_path / name
    train(cfg, run_dir, log=lambda *_: None, evaluator=make_evaluator(f"pairs:{dev}"))
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [[r["step"], r["loss"]] for r in rows if "loss" in r]


@pytest.mark.parametrize("name", sorted(RUNS))
def test_losses_are_the_pinned_ones(name, tiny_model_dir, shared_data, tmp_path):
    got = run_losses(name, tiny_model_dir, shared_data, tmp_path)
    assert [s for s, _ in got] == [1, 2, 3, 4, 5]
    assert [loss for _, loss in got] == pytest.approx(PINNED[name], rel=1e-5, abs=1e-7), got
