"""The training loop: objective-agnostic, and selection-agnostic.

It only calls the Objective contract (training/objectives/base.py) and an Evaluator
(training/selection.py: a name and `evaluator(encoder) -> float`, higher is better; STS-B dev as the
papers do unless told otherwise). Around them: seeds, device and mixed precision, gradient
accumulation, torchrun/DDP, periodic dev evaluation keeping the best checkpoint, a resumable
`checkpoint.pt`, `metrics.jsonl`, and a loss / dev-score plot.

Resume is exact (training/resume.py): each epoch's batch order is a function of (seed, epoch), the
checkpoint records how many batches of the epoch were consumed, and a resumed run replays those
batches' collate (without training on them) before restoring every RNG, so collate-time randomness
in DataLoader workers lines up as well.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler
from tqdm.auto import tqdm

from core.data import load_examples
from core.default_model import model_label, resolve_model
from core.encoder import SentenceEncoder
from training.config import TrainConfig
from training.gradcache import cached_step
from training.objectives import get_objective
from training.optim import build_optimizer
from training.resume import (
    CHECKPOINT,
    all_rng_states,
    config_changes,
    load_checkpoint,
    save_checkpoint,
    set_rng_state,
    truncate_metrics,
)
from training.sampling import make_batch_sampler
from training.selection import Evaluator, KeepRule, make_evaluator


@dataclass
class TrainResult:
    run_dir: Path
    best_dir: Path
    best_step: int
    best_dev: float
    initial_dev: float
    steps: int
    seconds: float
    is_main: bool = True  # rank 0: the only rank that evaluates, checkpoints and exports
    dev_metric: str = ""  # the evaluator's name: what best_dev and initial_dev measure


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)


def _to_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    def move(v):
        if isinstance(v, torch.Tensor):
            return v.to(device, non_blocking=True)
        if isinstance(v, dict):
            return {k: x.to(device, non_blocking=True) if isinstance(x, torch.Tensor) else x for k, x in v.items()}
        return v

    return {k: move(v) for k, v in batch.items()}


def _autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """auto: bf16 on a GPU that has it, else fp16 (the papers' mixed precision); fp32 on a CPU.
    An explicit bf16 / fp16 is honoured on a CPU too (CPU autocast), which is how tests reach fp16."""
    if precision == "fp32" or (precision == "auto" and device.type != "cuda"):
        return None
    if precision == "auto":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if precision not in ("bf16", "fp16"):
        raise ValueError(f"unknown precision {precision!r}; choose from auto, fp32, bf16, fp16")
    return {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]


def _lr_lambda(schedule: str, warmup: int, total: int):
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        if schedule == "linear":
            return max(0.0, 1.0 - progress)
        if schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
        return 1.0

    if schedule not in ("linear", "cosine", "constant"):
        raise ValueError(f"unknown schedule {schedule!r}")
    return f


def _setup_distributed() -> tuple[int, int, torch.device]:
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return rank, world, torch.device("cuda", local)
    return rank, world, torch.device("cpu")


def train(cfg: TrainConfig, run_dir: Path, log=print, stop_at: int | None = None,
          evaluator: Evaluator | None = None) -> TrainResult:
    """`stop_at`: end this session after that step with a checkpoint, as a pre-empted job would.
    `evaluator` picks best/ (default: the one `cfg.select` names, built before any training)."""
    rank, world, device = _setup_distributed()
    main = rank == 0
    if evaluator is None:
        evaluator = make_evaluator(cfg.select, cfg.data_dir)
    seed_everything(cfg.seed + rank)
    state = load_checkpoint(cfg.resume / CHECKPOINT) if cfg.resume else None
    if state is not None and "config" not in state:
        raise ValueError(f"{cfg.resume / CHECKPOINT} predates exact resume (no config, RNG or data position)")
    changes = config_changes(state["config"], cfg.to_json()) if state else []
    if changes and not cfg.allow_config_change:
        raise ValueError(f"{cfg.resume} was trained with another config; set allow_config_change (CLI "
                         f"--allow-config-change) to resume anyway. Changed: {'; '.join(changes)}")
    if main:
        run_dir.mkdir(parents=True, exist_ok=True)
        if state is None or changes:  # a resume keeps the run's config unless a change was allowed
            (run_dir / "config.json").write_text(json.dumps(cfg.to_json(), indent=2))

    encoder = SentenceEncoder.from_pretrained(resolve_model(cfg.base_model), max_seq_length=cfg.max_seq_length,
                                              attn_implementation="sdpa")
    encoder.base_model = model_label(cfg.base_model)
    objective = get_objective(cfg.method)(encoder, cfg.objective)
    examples = load_examples(objective.data_kind, cfg.train_data, cfg.data_dir, limit=cfg.train_limit)
    if len(examples) < 2:
        raise ValueError(f"{cfg.train_data!r} gave {len(examples)} training examples; need at least 2")
    log(f"[train] {cfg.method}: {len(examples)} {objective.data_kind} examples from {cfg.train_data}, "
        f"base {encoder.base_model}, device {device}, world {world}")

    objective.to(device)
    if state is not None:  # before prepare(): work saved in the state (InfoCSE's stage 1) is not redone
        objective.load_checkpoint_state_dict(state["objective"])
    objective.prepare(examples, device)

    batch_sampler = make_batch_sampler(objective.batch_sampler, examples, cfg.batch_size, seed=cfg.seed,
                                       num_replicas=world, rank=rank)
    # Worker seeds come from this generator, reseeded each epoch, so they do not depend on the global RNG.
    loader_rng = torch.Generator()
    if batch_sampler is not None:
        loader = DataLoader(examples, batch_sampler=batch_sampler, collate_fn=objective.collate,
                            num_workers=cfg.num_workers, generator=loader_rng)
    else:
        # One replica is a plain shuffle whose order is a function of (seed, epoch): resumable mid-epoch.
        sampler = DistributedSampler(examples, world, rank, shuffle=True, seed=cfg.seed)
        loader = DataLoader(examples, batch_size=cfg.batch_size, sampler=sampler, collate_fn=objective.collate,
                            num_workers=cfg.num_workers, drop_last=len(examples) >= 2 * cfg.batch_size,
                            generator=loader_rng)

    steps_per_epoch = max(1, len(loader) // cfg.grad_accum)
    total_steps = math.ceil(cfg.epochs * steps_per_epoch)
    if cfg.max_steps:
        total_steps = min(total_steps, cfg.max_steps)
    params = [p for p in objective.parameters() if p.requires_grad]
    optimizer = build_optimizer(objective, cfg.optimizer, cfg.lr, cfg.weight_decay)
    if cfg.eval_unit not in ("steps", "epochs"):
        raise ValueError(f"eval_unit must be 'steps' or 'epochs', not {cfg.eval_unit!r}")
    eval_steps = cfg.eval_every * (steps_per_epoch if cfg.eval_unit == "epochs" else 1)
    warmup = int(cfg.warmup_ratio * total_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_lambda(cfg.schedule, warmup, total_steps))
    amp_dtype = _autocast_dtype(cfg.precision, device)
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)
    model = objective
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(
            objective, device_ids=[device.index] if device.type == "cuda" else None, find_unused_parameters=True)

    step, best_dev, best_step, epoch = 0, -math.inf, 0, 0
    keep_rule = KeepRule(margin=cfg.select_margin, confidence=cfg.select_confidence, seed=cfg.seed)
    base_items: list[float] | None = None  # the base model's per-item dev scores, for the paired bootstrap
    best_rule = ""
    micro, seen = 0, 0  # micro-batches in all; batches of this epoch consumed
    best_dir, ckpt = run_dir / "best", run_dir / CHECKPOINT
    metrics_path = run_dir / "metrics.jsonl"
    rng_to_restore = None
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        scaler.load_state_dict(state["scaler"])
        step, best_dev, best_step, epoch = state["step"], state["best_dev"], state["best_step"], state["epoch"]
        micro, seen, initial_dev = state["micro"], state["batches_in_epoch"], state["initial_dev"]
        base_items, best_rule = state.get("base_items"), state.get("best_rule", "")
        if seen >= len(loader):
            epoch, seen = epoch + 1, 0
        rngs = state["rng"]
        rng_to_restore = rngs[rank] if rank < len(rngs) else None  # another world size: fresh streams
        if main:
            truncate_metrics(metrics_path, step)
            if changes:
                with open(metrics_path, "a") as f:
                    f.write(json.dumps({"step": step, "config_changes": changes}) + "\n")
        log(f"[train] resumed from {cfg.resume / CHECKPOINT} at step {step} (epoch {epoch}, batch {seen})"
            + (f"; config changes allowed: {'; '.join(changes)}" if changes else ""))

    def save() -> None:
        rngs = all_rng_states()  # a collective under DDP: every rank calls save() at the same steps
        if main:
            save_checkpoint({"objective": objective.checkpoint_state_dict(), "optimizer": optimizer.state_dict(),
                             "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(),
                             "step": step, "epoch": epoch, "batches_in_epoch": seen, "micro": micro,
                             "best_dev": best_dev, "best_step": best_step, "initial_dev": initial_dev,
                             "base_items": base_items, "best_rule": best_rule,
                             "rng": rngs, "config": cfg.to_json()}, ckpt)

    def record(entry: dict[str, Any]) -> None:
        if main:
            with open(metrics_path, "a") as f:
                f.write(json.dumps(entry) + "\n")

    def evaluate() -> float:
        nonlocal best_dev, best_step, base_items, best_rule
        dev = float(evaluator(objective.inference_encoder()))
        items = getattr(evaluator, "item_scores", None)
        first = not math.isfinite(best_dev)
        decision = keep_rule.decide(dev, best_dev, None if first else initial_dev, items, base_items)
        if first:
            base_items = None if items is None else list(items)
        record({"step": step, "dev": dev, "select": evaluator.name, "kept": decision.keep, "rule": decision.rule})
        log(f"[select] step {step}: {evaluator.name} {dev:.2f} {'kept' if decision.keep else 'not kept'}"
            f" ({decision.rule})")
        if decision.keep:
            best_dev, best_step, best_rule = dev, step, decision.rule
            objective.inference_encoder().save_pretrained(best_dir)
        return dev

    start = time.perf_counter()
    if state is None:
        metrics_path.unlink(missing_ok=True)
        initial_dev = evaluate() if main else float("nan")
        log(f"[train] step 0 {evaluator.name} {initial_dev:.2f}")
        saved = _saved_base_if_other(cfg, objective.inference_encoder()) if main else None
        if saved is not None:  # the run changed the model before training: measure gains from the better one
            saved_dev = float(evaluator(saved.to(device)))
            better = saved_dev > initial_dev
            record({"step": 0, "dev_saved_base": saved_dev, "kept": better})
            log(f"[select] step 0 is not the base model as saved ({cfg.base_model}, {saved.pooling} pooling), "
                f"which scores {saved_dev:.2f}: " + ("kept as best/, and the base every later checkpoint must beat "
                                                    "beyond noise" if better else "step 0 stays the base"))
            if better:
                initial_dev = best_dev = saved_dev
                base_items = None if getattr(evaluator, "item_scores", None) is None else list(evaluator.item_scores)
                best_rule = "the base model as saved: the run's step 0 scored lower"
                saved.save_pretrained(best_dir)
            del saved

    bar = tqdm(total=total_steps, initial=step, disable=not main, desc=cfg.method, dynamic_ncols=True)
    objective.train()
    while step < total_steps:
        for s in (batch_sampler, getattr(loader, "sampler", None)):
            if hasattr(s, "set_epoch"):
                s.set_epoch(epoch)
        loader_rng.manual_seed((cfg.seed + rank) * 1_000_003 + epoch)
        batches = iter(loader)
        for _ in range(seen):  # on resume: the batches this epoch already trained on
            next(batches)
        if rng_to_restore is not None:
            set_rng_state(rng_to_restore)
            rng_to_restore = None
        for batch in batches:
            seen += 1
            batch = _to_device(batch, device)
            sync = (micro + 1) % cfg.grad_accum == 0
            ctx = model.no_sync() if world > 1 and not sync else contextlib.nullcontext()
            if cfg.grad_cache:
                with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                    out = cached_step(objective, batch, cfg.grad_cache, lambda x: scaler.scale(x).backward())
                if world > 1:  # DDP's hooks need its forward, which GradCache bypasses: average by hand
                    for p in params:
                        if p.grad is not None:
                            dist.all_reduce(p.grad)
                            p.grad /= world
            else:
                with ctx, torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                    out = model(batch)
                    loss = out["loss"] / cfg.grad_accum
                scaler.scale(loss).backward()
            micro += 1
            if not sync:
                continue
            if cfg.max_grad_norm:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            step += 1
            entry = {"step": step, "lr": scheduler.get_last_lr()[0],
                     **{k: float(v.detach()) for k, v in out.items() if torch.is_tensor(v) and v.numel() == 1}}
            record(entry)
            bar.update(1)
            bar.set_postfix(loss=f"{entry['loss']:.3g}", best=f"{best_dev:.2f}")
            if step % eval_steps == 0 or step == total_steps:
                if main:
                    evaluate()
                    objective.train()
                save()
            elif step == stop_at:
                save()
            if step >= total_steps or step == stop_at:
                break
        if step == stop_at:
            break
        epoch, seen = epoch + 1, 0
    bar.close()
    seconds = time.perf_counter() - start
    if main:
        plot_metrics(metrics_path, run_dir / "metrics.png", title=f"{cfg.method} ({cfg.preset})",
                     dev_label=evaluator.name)
        log(f"[train] {step} steps in {seconds:.0f}s; best {evaluator.name} {best_dev:.2f} at step {best_step} "
            f"(start {initial_dev:.2f}; decided by: {best_rule})")
    if world > 1:
        dist.barrier()  # the other ranks wait for rank 0's last evaluation and checkpoint
    return TrainResult(run_dir, best_dir, best_step, best_dev, initial_dev, step, seconds, is_main=main,
                       dev_metric=evaluator.name)


#: sentences whose vectors tell whether a run's step 0 is the base model as saved
_PROBES = ["A man is playing a guitar.", "The committee approved the budget for next year.", "Hi"]


def _saved_base_if_other(cfg: TrainConfig, step0: SentenceEncoder) -> SentenceEncoder | None:
    """The base model as it was saved (its own pooling and head), if the run's step 0 computes other vectors:
    a pooling override (all-MiniLM-L6-v2 with CLS pooling starts 19 dev points below its mean pooling) or a
    head that starts untrained (CLSR's random e: 7.8 below). None when step 0 is that model, or a pair scorer
    (a cross-encoder's base is no pair scorer to compare)."""
    if not isinstance(step0, SentenceEncoder):
        return None
    saved = SentenceEncoder.from_pretrained(resolve_model(cfg.base_model), max_seq_length=cfg.max_seq_length)
    ours, theirs = step0.encode(_PROBES), saved.encode(_PROBES)
    return None if ours.shape == theirs.shape and np.allclose(ours, theirs, atol=1e-5) else saved


def plot_metrics(metrics_path: Path, out_png: Path, title: str = "", dev_label: str = "dev score") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in metrics_path.read_text().splitlines()]
    losses = [(r["step"], r["loss"]) for r in rows if "loss" in r]
    devs = [(r["step"], r["dev"]) for r in rows if "dev" in r]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    if losses:
        ax.plot(*zip(*losses), color="tab:blue", alpha=0.7, label="training loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss", color="tab:blue")
    ax2 = ax.twinx()
    if devs:
        ax2.plot(*zip(*devs), "o-", color="tab:red", label=dev_label)
    ax2.set_ylabel(dev_label, color="tab:red")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
