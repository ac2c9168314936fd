"""Correctness at scale: 2 gloo processes must train exactly like one process on the global batch.

Each multi-process test spawns its processes once (starting torch is the slow part) and checks
every objective from what they write back.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader

from core.data import PairExample, ScoredPair
from training.config import make_config
from training.distributed import replicate
from training.gradcache import cached_step
from training.loop import run_stages
from training.objectives import METHODS, get_objective, make_settings
from training.sampling import MixedLabelBatchSampler, make_batch_sampler

WORLD = 2
TEXTS = [
    "A man is playing a guitar.",
    "The cat sleeps on the warm mat.",
    "Stocks fell sharply on Monday morning.",
    "She baked bread for the whole family.",
    "Two children run across the wet field.",
    "The committee postponed its final vote.",
    "A dog chases a red ball in the park.",
    "Rain is expected over the weekend.",
]
LABELS = [4.8, 0.2, 2.5, 3.1, 1.0, 4.0, 0.6, 2.9]
# A distinct label per pair and a frozen-encoder cache for CLSR; a few keywords so every path counts:
# InfoCSE's aux loss weighted enough to show, CLSR's heads small.
KEYWORDS = {
    "simcse": {},
    "conisi": {},
    "infocse": {"aux_weight": 0.5, "stage1_steps": 0},
    "cosent": {},
    "cosent-cross": {"dropout": 0.0},
    "clsr": {"hidden_dim": 16, "out_dim": 16, "proj_dim": 16},
}
# How each objective's batch stacks its N examples: groups of N rows per tensor (SimCSE's [x; x] is 2).
LAYOUT = {
    "simcse": {"features": 2},
    "infocse": {"features": 2, "mlm": 1},
    "conisi": {"single": 1, "pairs": 2},
    "cosent": {"features": 2, "labels": 1},
    "cosent-cross": {"features": 1, "labels": 1},  # one [CLS] s1 [SEP] s2 [SEP] row per pair
    "clsr": {"vectors": 2},
}


def _examples(method: str) -> list:
    kind = get_objective(method).data_kind
    if kind == "scored":
        return [ScoredPair(a, b, y) for a, b, y in zip(TEXTS, TEXTS[1:] + TEXTS[:1], LABELS)]
    if kind == "pairs":
        return [PairExample(a, a.lower()) for a in TEXTS]
    return list(TEXTS)


def _build(method: str, model_dir: Path):
    """The same objective in every process: fixed seed, no dropout (two forwards must agree), float64."""
    from core.encoder import SentenceEncoder

    torch.manual_seed(0)
    encoder = SentenceEncoder.from_pretrained(model_dir, max_seq_length=32)
    obj = get_objective(method)(encoder, make_settings(method, KEYWORDS[method]))
    run_stages(obj, TEXTS, torch.device("cpu"))  # InfoCSE (stage1_steps=0): builds the frozen lower copy only
    return obj.double().train()


def _shard(method: str, batch: dict, rank: int, world: int, n: int) -> dict:
    """Rank `rank`'s part of a global batch of n examples, as a DistributedSampler would give it."""
    assert set(batch) == set(LAYOUT[method])
    b = n // world

    def cut(t: torch.Tensor, groups: int) -> torch.Tensor:
        return torch.cat([t[g * n + rank * b : g * n + (rank + 1) * b] for g in range(groups)])

    return {
        key: {k: cut(t, groups) for k, t in batch[key].items()} if isinstance(batch[key], dict)
        else cut(batch[key], groups)
        for key, groups in LAYOUT[method].items()
    }


def _grads(obj) -> dict[str, torch.Tensor]:
    return {name: p.grad.detach().clone() for name, p in obj.named_parameters() if p.grad is not None}


def _spawn(fn, args: tuple, timeout: float = 240.0) -> None:
    """Run fn(rank, *args) on WORLD processes; fail (instead of hanging the suite) past `timeout`."""
    ctx = mp.start_processes(fn, args=args, nprocs=WORLD, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=1.0):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.terminate()
            pytest.fail(f"{fn.__name__} did not finish in {timeout:.0f}s (a collective hung)")


def _init(rank: int, init_file: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)


def _grad_worker(rank: int, init_file: str, model_dir: str, work: str) -> None:
    _init(rank, init_file)
    try:
        for method in METHODS:
            obj = _build(method, Path(model_dir))
            obj.load_state_dict(torch.load(Path(work) / f"{method}-state.pt"))
            batch = torch.load(Path(work) / f"{method}-batch.pt")
            ddp = torch.nn.parallel.DistributedDataParallel(obj, find_unused_parameters=True)
            ddp(_shard(method, batch, rank, WORLD, len(TEXTS)))["loss"].backward()
            if rank == 0:
                torch.save(_grads(obj), Path(work) / f"{method}-grads-ddp.pt")
            if method in GRAD_CACHE_METHODS:  # GradCache's passes through the loop's DDP wrapper
                obj = _build(method, Path(model_dir))
                obj.load_state_dict(torch.load(Path(work) / f"{method}-state.pt"))
                model = replicate(obj, torch.device("cpu"))
                cached_step(obj, _shard(method, batch, rank, WORLD, len(TEXTS)), micro_batch=3, forward=model,
                            no_sync=model.no_sync)
                if rank == 0:
                    torch.save(_grads(obj), Path(work) / f"{method}-grads-cached-ddp.pt")
        # CoSENT with the label-mixing sampler over an epoch whose batches need repairs (1 off-label item)
        obj = _build("cosent", Path(model_dir))
        examples = [ScoredPair(t, t.lower(), 1.0 if i == 0 else 0.0) for i, t in enumerate(TEXTS * 3)][:21]
        sampler = make_batch_sampler("mixed_labels", examples, 4, seed=0, num_replicas=WORLD, rank=rank)
        ddp = torch.nn.parallel.DistributedDataParallel(obj, find_unused_parameters=True)
        sizes = []
        for batch in DataLoader(examples, batch_sampler=sampler, collate_fn=obj.collate):
            ddp(batch)["loss"].backward()
            sizes.append(len(batch["labels"]))
        (Path(work) / f"mixed-{rank}.json").write_text(json.dumps(sizes))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def nodrop_model_dir(tmp_path_factory, default_model_dir) -> Path:
    """The tiny 2-layer BERT of conftest without dropout: every forward of a batch is the same."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("tiny-bert-nodrop")
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    BertModel(config, add_pooling_layer=False).save_pretrained(out)
    AutoTokenizer.from_pretrained(default_model_dir).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def two_process_grads(nodrop_model_dir, tmp_path_factory):
    """{method: (single-process gradient on the global batch, 2-process DDP gradient)}."""
    work = tmp_path_factory.mktemp("ddp-grads")
    reference = {}
    for method in METHODS:
        obj = _build(method, nodrop_model_dir)
        examples = _examples(method)
        obj.prepare(examples, torch.device("cpu"))  # CLSR's cache; a no-op for the rest
        torch.manual_seed(1)  # masking / sentence pairing in collate
        batch = obj.collate(examples)
        torch.save(obj.state_dict(), work / f"{method}-state.pt")
        torch.save(batch, work / f"{method}-batch.pt")
        obj(batch)["loss"].backward()
        reference[method] = _grads(obj)
    _spawn(_grad_worker, (str(work / "init"), str(nodrop_model_dir), str(work)))
    grads = {m: (reference[m], torch.load(work / f"{m}-grads-ddp.pt")) for m in METHODS}
    grads.update({f"{m}-cached": (reference[m], torch.load(work / f"{m}-grads-cached-ddp.pt"))
                  for m in GRAD_CACHE_METHODS})
    return grads, [json.loads((work / f"mixed-{r}.json").read_text()) for r in range(WORLD)]


# GradCache on 2 processes (its mini-batches of 3 from each rank's 4 examples; the objective's heads get
# their gradient in the loss pass, which DDP averages though it holds the averaging back until the last pass)
@pytest.mark.parametrize("method", [*METHODS, "simcse-cached", "cosent-cached"])
def test_two_process_gradient_equals_the_global_batch_gradient(two_process_grads, method):
    reference, ddp = two_process_grads[0][method]
    assert reference, "no parameter got a gradient"
    # Some gradients are zero in exact arithmetic (attention key biases): measure those against
    # the whole gradient's size, not their own rounding noise.
    floor = 1e-6 * torch.cat([g.flatten() for g in reference.values()]).norm()
    errors = {}
    for name, g in reference.items():
        assert name in ddp, f"{name} got no gradient under DDP"
        errors[name] = float((ddp[name] - g).norm() / torch.maximum(g.norm(), floor))
    worst = max(errors, key=errors.get)
    assert errors[worst] < 1e-6, f"{method}: {worst} relative gradient error {errors[worst]:.3g}"


# --- batch sizes under DDP ------------------------------------------------------------------------


def test_mixed_label_sampler_gives_every_rank_equal_batches():
    # 1 off-label item among 21: batches need a duplicate (oversample) or are one short (no drop_last)
    labels = [0.0] * 20 + [1.0]
    for drop_last in (False, True):
        samplers = [MixedLabelBatchSampler(labels, 4, drop_last=drop_last, seed=3, num_replicas=2, rank=r)
                    for r in range(2)]
        for epoch in range(3):
            for s in samplers:
                s.set_epoch(epoch)
            per_rank = [[len(b) for b in s] for s in samplers]
            assert per_rank[0] == per_rank[1] == [4] * len(samplers[0])
            assert all(len(set(labels[i] for i in b)) == 2 for s in samplers for b in s)


def test_cosent_with_mixed_label_batches_runs_an_epoch_on_two_processes(two_process_grads):
    sizes = two_process_grads[1]
    assert sizes[0] == sizes[1] == [4] * 2  # 21 examples: 5 full global batches, 2 per rank


def test_cosent_defaults_to_plain_shuffled_batches(tiny_encoder):
    from training.objectives.cosent import CoSENT, CoSENTSettings

    assert CoSENT(tiny_encoder).batch_sampler is None  # the paper's code: shuffled batches
    assert CoSENT(tiny_encoder, CoSENTSettings(batch_sampler="mixed_labels")).batch_sampler == "mixed_labels"
    with pytest.raises(ValueError, match="batch sampler"):
        CoSENT(tiny_encoder, CoSENTSettings(batch_sampler="nope"))


def _train_worker(rank: int, init_file: str, model_dir: str, data_dir: str, out: str) -> None:
    os.environ.update(WORLD_SIZE=str(WORLD), RANK=str(rank), LOCAL_RANK=str(rank))
    _init(rank, init_file)  # the trainer uses the group it finds
    from training.trainer import train

    try:
        # InfoCSE's stage 1 through the loop on 2 processes, each masking its own slice (per-rank seeds), in
        # micro-batches of 2: DDP must average every step's gradient, so both ranks end with the same weights
        from core.encoder import SentenceEncoder

        torch.manual_seed(rank)
        encoder = SentenceEncoder.from_pretrained(model_dir, max_seq_length=32)
        obj = get_objective("infocse")(encoder, make_settings("infocse", {
            "stage1_steps": 2, "stage1_batch_size": 8, "stage1_micro_batch_size": 2, "stage1_lr": 1e-2}))
        start = encoder.transformer.encoder.layer[0].attention.self.query.weight.detach().clone()
        run_stages(obj, TEXTS, torch.device("cpu"))
        weights = {"query": encoder.transformer.encoder.layer[0].attention.self.query.weight,
                   "extra": obj.extra_layers.layers[0].output.dense.weight}
        (Path(out) / f"stage1-{rank}.json").write_text(json.dumps({
            "moved": float((weights["query"] - start).abs().max()),
            **{k: w.detach().flatten()[:64].tolist() for k, w in weights.items()}}))
        for name, objective, cache in (("plain", {}, None), ("mixed", {"batch_sampler": "mixed_labels"}, None),
                                       ("cached", {}, 3)):
            # 50 pairs in batches of 8: the label-mixing sampler's last global batch is short
            cfg = make_config("cosent", "quick", base_model=model_dir, data_dir=Path(data_dir), train_limit=50,
                              batch_size=8, epochs=3, max_steps=5, eval_every=1000, max_seq_length=24,
                              warmup_ratio=0.0, objective=objective, grad_cache=cache)
            result = train(cfg, Path(out) / f"{name}-run", log=lambda *_: None)
            (Path(out) / f"{name}-{rank}.json").write_text(json.dumps({"steps": result.steps}))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # three short trainer runs (with STS-B dev evaluations) on 2 processes: minutes on a busy CPU
def test_cosent_trains_on_two_processes(tiny_model_dir, shared_data, tmp_path):
    _spawn(_train_worker, (str(tmp_path / "init"), str(tiny_model_dir), str(shared_data), str(tmp_path)))
    stage1 = [json.loads((tmp_path / f"stage1-{r}.json").read_text()) for r in range(WORLD)]
    assert stage1[0]["moved"] > 1e-4 and stage1[0] == stage1[1]
    for name in ("plain", "mixed", "cached"):
        assert [json.loads((tmp_path / f"{name}-{r}.json").read_text())["steps"] for r in range(WORLD)] == [5, 5]
        rows = [json.loads(line) for line in (tmp_path / f"{name}-run" / "metrics.jsonl").read_text().splitlines()]
        losses = [r["loss"] for r in rows if "loss" in r]
        assert len(losses) == 5 and all(x == x and x > 0 for x in losses)


# --- gradient accumulation ------------------------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
def test_gradient_accumulation_is_refused_for_in_batch_objectives(method):
    with pytest.raises(ValueError, match="in-batch"):
        make_config(method, "quick", grad_accum=2)
    assert make_config(method, "quick", grad_accum=1).grad_accum == 1


def test_grad_cache_is_refused_where_unsupported():
    assert make_config("simcse", "quick", grad_cache=16).grad_cache == 16
    with pytest.raises(ValueError, match="GradCache"):
        make_config("conisi", "quick", grad_cache=16)
    with pytest.raises(ValueError, match="grad_cache=<mini-batch>"):
        make_config("cosent", "quick", grad_accum=4)


# --- GradCache --------------------------------------------------------------------------------------

GRAD_CACHE_METHODS = ("simcse", "cosent")


@pytest.mark.parametrize("method", GRAD_CACHE_METHODS)
def test_grad_cache_equals_the_full_batch_gradient(method, nodrop_model_dir):

    obj = _build(method, nodrop_model_dir)
    batch = obj.collate(_examples(method))
    out = obj(batch)
    out["loss"].backward()
    full = _grads(obj)
    obj.zero_grad(set_to_none=True)
    cached = cached_step(obj, batch, micro_batch=3)  # 8 examples: mini-batches of 3, 3, 2
    assert cached["loss"].item() == pytest.approx(out["loss"].item(), rel=1e-12)
    got = _grads(obj)
    assert set(got) == set(full)
    for name, g in full.items():
        assert torch.allclose(got[name], g, rtol=1e-9, atol=1e-12), name


@pytest.mark.parametrize("method", GRAD_CACHE_METHODS)
def test_grad_cache_replays_the_dropout_masks(method, tiny_model_dir):
    """With dropout on, the re-embedding must see the masks of the cached pass: the gradient equals
    that of the same mini-batch forwards kept in one graph."""
    from training.gradcache import _regroup, take_rows

    obj = _build(method, tiny_model_dir)
    batch = obj.collate(_examples(method))
    bounds = [(0, 3), (3, 6), (6, 8)]
    with torch.no_grad():
        assert not torch.equal(obj.embed(batch), obj.embed(batch))  # dropout is on
    torch.manual_seed(5)
    parts = [obj.embed(take_rows(batch, obj.row_groups, a, b)) for a, b in bounds]
    obj.loss_from_embedded(_regroup(parts, obj.embed_groups), batch)["loss"].backward()
    want = _grads(obj)
    obj.zero_grad(set_to_none=True)
    torch.manual_seed(5)
    cached_step(obj, batch, micro_batch=3)
    got = _grads(obj)
    for name, g in want.items():
        assert torch.allclose(got[name], g, rtol=1e-9, atol=1e-12), name
