"""The trainer: a run's set-up, its stages through the one loop (training/loop.py), its tear-down.

    train(cfg, run_dir) = Trainer(...)             set-up: everything the config names, loaded once
                          run_stages(...)          the objective's own earlier stages (InfoCSE's stage 1)
                          Trainer.main_stage()     the run's stage: optimiser, schedule, precision, batches
                          Trainer.begin()          the resumed state, or step 0 evaluated
                          run_stage(main, ...)     the run's stage; after each step Trainer.after_step
                          Trainer.finish()         tear-down: the plot, the result

Set-up joins the process group and seeds every RNG, reads the checkpoint to resume (training/resume.py:
`Checkpoint`, whose `TrainState` the run then carries on), loads the encoder and a copy of it as saved
(core/encoder.py), the examples of the objective's `data_kind` (core/data.py), builds the objective
(training/objectives/) and the `Selector` that keeps best/ (training/selection.py; an Evaluator with a
name and `evaluator(encoder) -> float`, higher is better; STS-B dev as the papers do unless told
otherwise). The run's stage (its optimiser, LR schedule, mixed precision and batches) is built once the
earlier stages are done, which may change the objective's parameters. After each of its steps: a row of
`metrics.jsonl`, and every `eval_every` an evaluation and a resumable `checkpoint.pt`.

Resume is exact: each epoch's batch order is a function of (seed, epoch), the checkpoint records how
many batches of the epoch were consumed, and a resumed run replays those batches' collate (without
training on them) before restoring every RNG, so collate-time randomness in DataLoader workers lines
up as well (`EpochBatches`).
"""

from __future__ import annotations

import copy
import json
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

from core.data import load_examples
from core.default_model import model_label, resolve_model
from core.encoder import SentenceEncoder
from training import distributed
from training.config import TrainConfig
from training.loop import run_stage, run_stages
from training.objectives import get_objective
from training.objectives.base import Objective, Stage
from training.optim import build_optimizer, build_scheduler
from training.resume import (
    CHECKPOINT,
    Checkpoint,
    TrainState,
    all_rng_states,
    config_changes,
    set_rng_state,
    truncate_metrics,
)
from training.sampling import make_batch_sampler
from training.selection import Evaluator, KeepRule, Selector, make_evaluator


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


def train(cfg: TrainConfig, run_dir: Path, log=print, stop_at: int | None = None,
          evaluator: Evaluator | None = None) -> TrainResult:
    """`stop_at`: end this session after that step with a checkpoint, as a pre-empted job would.
    `evaluator` picks best/ (default: the one `cfg.select` names, built before any training)."""
    trainer = Trainer(cfg, run_dir, log, evaluator, stop_at)  # set-up
    run_stages(trainer.objective, trainer.examples, trainer.device)  # the objective's earlier stages, if any
    stage = trainer.main_stage()
    trainer.begin()  # resumed where the checkpoint stopped, or step 0 evaluated
    run_stage(trainer.objective, stage, trainer.device, trainer.state, trainer.after_step)
    return trainer.finish()  # tear-down


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """auto: bf16 on a GPU that has it, else fp16 (the papers' mixed precision); fp32 on a CPU.
    An explicit bf16 / fp16 is honoured on a CPU too (CPU autocast), which is how tests reach fp16."""
    if precision == "fp32" or (precision == "auto" and device.type != "cuda"):
        return None
    if precision == "auto":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if precision not in ("bf16", "fp16"):
        raise ValueError(f"unknown precision {precision!r}; choose from auto, fp32, bf16, fp16")
    return {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]


class Trainer:
    """One run: what set-up loads from the config, the run's TrainState, and what follows each step."""

    def __init__(self, cfg: TrainConfig, run_dir: Path, log=print, evaluator: Evaluator | None = None,
                 stop_at: int | None = None):
        self.cfg, self.run_dir, self.log, self.stop_at = cfg, run_dir, log, stop_at
        self.rank, self.world, self.device = distributed.set_up()
        self.main = self.rank == 0
        if evaluator is None:
            evaluator = make_evaluator(cfg.select, cfg.data_dir)
        seed_everything(cfg.seed + self.rank)
        self.checkpoint, self.changes = self._read_checkpoint()
        self.state = self.checkpoint.state if self.checkpoint else TrainState()
        self.metrics = run_dir / "metrics.jsonl"

        encoder = SentenceEncoder.from_pretrained(resolve_model(cfg.base_model), max_seq_length=cfg.max_seq_length,
                                                  attn_implementation="sdpa")
        encoder.base_model = model_label(cfg.base_model)
        # the base as saved, before the objective sets its pooling or head: step 0 may be another model
        self.base = copy.deepcopy(encoder) if self.main and self.checkpoint is None else None
        self.objective: Objective = get_objective(cfg.method)(encoder, cfg.objective)
        self.examples = load_examples(self.objective.data_kind, cfg.train_data, cfg.data_dir, limit=cfg.train_limit)
        if len(self.examples) < 2:
            raise ValueError(f"{cfg.train_data!r} gave {len(self.examples)} training examples; need at least 2")
        log(f"[train] {cfg.method}: {len(self.examples)} {self.objective.data_kind} examples from {cfg.train_data}, "
            f"base {encoder.base_model}, device {self.device}, world {self.world}")

        self.objective.to(self.device)
        if self.checkpoint is not None:  # before prepare() and stages(): work the state holds is not redone
            self.objective.load_checkpoint_state_dict(self.checkpoint.objective)
        self.objective.prepare(self.examples, self.device)
        rule = KeepRule(margin=cfg.select_margin, confidence=cfg.select_confidence, seed=cfg.seed)
        self.selector = Selector(evaluator, rule, run_dir / "best", self.state, self.record, log)

    def _read_checkpoint(self) -> tuple[Checkpoint | None, list[str]]:
        """The checkpoint to resume (None: a fresh run) and the config changes since it, refused unless allowed;
        the run's config.json."""
        cfg = self.cfg
        checkpoint = Checkpoint.load(cfg.resume / CHECKPOINT) if cfg.resume else None
        changes = config_changes(checkpoint.config, cfg.to_json()) if checkpoint else []
        if changes and not cfg.allow_config_change:
            raise ValueError(f"{cfg.resume} was trained with another config; set allow_config_change (CLI "
                             f"--allow-config-change) to resume anyway. Changed: {'; '.join(changes)}")
        if self.main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            if checkpoint is None or changes:  # a resume keeps the run's config unless a change was allowed
                (self.run_dir / "config.json").write_text(json.dumps(cfg.to_json(), indent=2))
        return checkpoint, changes

    def main_stage(self) -> Stage:
        """The run's stage, from the config, with the checkpoint's optimiser, scheduler and scaler on resume."""
        cfg, state, checkpoint = self.cfg, self.state, self.checkpoint
        if cfg.eval_unit not in ("steps", "epochs"):
            raise ValueError(f"eval_unit must be 'steps' or 'epochs', not {cfg.eval_unit!r}")
        rngs = checkpoint.rng if checkpoint else []
        batches = EpochBatches(self.objective, self.examples, cfg, self.rank, self.world, state,
                               rngs[self.rank] if self.rank < len(rngs) else None)  # another world size: fresh streams
        steps_per_epoch = max(1, len(batches) // cfg.grad_accum)
        total_steps = math.ceil(cfg.epochs * steps_per_epoch)
        if cfg.max_steps:
            total_steps = min(total_steps, cfg.max_steps)
        self.eval_steps = cfg.eval_every * (steps_per_epoch if cfg.eval_unit == "epochs" else 1)
        optimizer = build_optimizer(self.objective, cfg.optimizer, cfg.lr, cfg.weight_decay)
        amp_dtype = autocast_dtype(cfg.precision, self.device)
        self.stage = Stage(
            cfg.method, batches, total_steps, optimizer,
            build_scheduler(optimizer, cfg.schedule, int(cfg.warmup_ratio * total_steps), total_steps),
            micro_batches=cfg.grad_accum, max_grad_norm=cfg.max_grad_norm,
            params=[p for p in self.objective.parameters() if p.requires_grad], autocast=amp_dtype,
            scaler=torch.amp.GradScaler(self.device.type, enabled=amp_dtype == torch.float16),
            grad_cache=cfg.grad_cache)
        if checkpoint is not None:
            for name in ("optimizer", "scheduler", "scaler"):
                getattr(self.stage, name).load_state_dict(getattr(checkpoint, name))
        return self.stage

    def begin(self) -> None:
        """On resume: metrics.jsonl back to the checkpoint's step (and the config changes allowed); on a fresh
        run: step 0 evaluated, which makes it best/ and the base (or the base as saved, if that scores higher)."""
        cfg, state = self.cfg, self.state
        self.start = time.perf_counter()
        if self.checkpoint is not None:
            if self.main:
                truncate_metrics(self.metrics, state.step)
                if self.changes:
                    self.record({"step": state.step, "config_changes": self.changes})
            self.log(f"[train] resumed from {cfg.resume / CHECKPOINT} at step {state.step} (epoch {state.epoch}, "
                     f"batch {state.batches_in_epoch})"
                     + (f"; config changes allowed: {'; '.join(self.changes)}" if self.changes else ""))
        elif self.main:
            self.metrics.unlink(missing_ok=True)
            self.selector.start(self.objective.inference_encoder(), self.base, cfg.base_model)
            self.base = None

    def after_step(self, step: int, out: dict[str, torch.Tensor]) -> bool:
        """The step's metrics; every eval_steps (and at the end) an evaluation and a checkpoint; a checkpoint at
        `stop_at` too, where this session ends (True)."""
        self.record({"step": step, "lr": self.stage.scheduler.get_last_lr()[0],
                     **{k: float(v.detach()) for k, v in out.items() if torch.is_tensor(v) and v.numel() == 1}})
        if step % self.eval_steps == 0 or step == self.stage.steps:
            if self.main:
                self.selector.evaluate(self.objective.inference_encoder(), step)
                self.objective.train()
            self.save()
        elif step == self.stop_at:
            self.save()
        return step == self.stop_at

    def record(self, entry: dict[str, Any]) -> None:
        if self.main:
            with open(self.metrics, "a") as f:
                f.write(json.dumps(entry) + "\n")

    def save(self) -> None:
        rngs = all_rng_states()  # a collective under DDP: every rank saves at the same steps
        if self.main:
            stage = self.stage
            Checkpoint(self.state, self.objective.checkpoint_state_dict(), stage.optimizer.state_dict(),
                       stage.scheduler.state_dict(), stage.scaler.state_dict(), self.cfg.to_json(), rngs,
                       ).save(self.run_dir / CHECKPOINT)

    def finish(self) -> TrainResult:
        seconds = time.perf_counter() - self.start
        state, name = self.state, self.selector.name
        if self.main:
            plot_metrics(self.metrics, self.run_dir / "metrics.png", title=f"{self.cfg.method} ({self.cfg.preset})",
                         dev_label=name)
            self.log(f"[train] {state.step} steps in {seconds:.0f}s; best {name} {state.best_dev:.2f} at step "
                     f"{state.best_step} (start {state.initial_dev:.2f}; decided by: {state.best_rule})")
        if self.world > 1:
            dist.barrier()  # the other ranks wait for rank 0's last evaluation and checkpoint
        return TrainResult(self.run_dir, self.run_dir / "best", state.best_step, state.best_dev, state.initial_dev,
                           state.step, seconds, is_main=self.main, dev_metric=name)


class EpochBatches:
    """The run's batches, epoch after epoch, keeping their position (epoch, batches consumed) in the TrainState.

    Each epoch's order is a function of (seed, epoch); worker seeds come from a generator reseeded each
    epoch, so they do not depend on the global RNG. On resume the epoch's consumed batches are collated
    again (not trained on) before every RNG is restored (`rng_to_restore`)."""

    def __init__(self, objective: Objective, examples: list, cfg: TrainConfig, rank: int, world: int,
                 state: TrainState, rng_to_restore: dict[str, Any] | None):
        batch_sampler = make_batch_sampler(objective.batch_sampler, examples, cfg.batch_size, seed=cfg.seed,
                                           num_replicas=world, rank=rank)
        self.generator = torch.Generator()
        if batch_sampler is not None:
            self.loader = DataLoader(examples, batch_sampler=batch_sampler, collate_fn=objective.collate,
                                     num_workers=cfg.num_workers, generator=self.generator)
        else:
            # One replica is a plain shuffle whose order is a function of (seed, epoch): resumable mid-epoch.
            sampler = DistributedSampler(examples, world, rank, shuffle=True, seed=cfg.seed)
            self.loader = DataLoader(examples, batch_size=cfg.batch_size, sampler=sampler, collate_fn=objective.collate,
                                     num_workers=cfg.num_workers, drop_last=len(examples) >= 2 * cfg.batch_size,
                                     generator=self.generator)
        self.samplers = [s for s in (batch_sampler, self.loader.sampler) if hasattr(s, "set_epoch")]
        self.seed = cfg.seed + rank
        self.state, self.rng_to_restore = state, rng_to_restore
        if state.batches_in_epoch >= len(self.loader):  # stopped at an epoch's end: resume with the next
            state.epoch, state.batches_in_epoch = state.epoch + 1, 0

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        state = self.state
        while True:
            for sampler in self.samplers:
                sampler.set_epoch(state.epoch)
            self.generator.manual_seed(self.seed * 1_000_003 + state.epoch)
            batches = iter(self.loader)
            for _ in range(state.batches_in_epoch):  # on resume: the batches this epoch already trained on
                next(batches)
            if self.rng_to_restore is not None:
                set_rng_state(self.rng_to_restore)
                self.rng_to_restore = None
            for batch in batches:
                state.batches_in_epoch += 1
                yield batch
            state.epoch, state.batches_in_epoch = state.epoch + 1, 0


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
