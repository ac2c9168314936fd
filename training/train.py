"""Train with one objective, keep the best checkpoint on a dev set, export it to ONNX.

    python -m training.train --method cosent [--preset quick] [--base DIR|name] [--data-dir DIR]
                             [--select stsb-dev | retrieval:<BEIR dir>[:split] | pairs:<tsv> | last]
                             [--set key=value ...] [--objective key=value ...]
    python -m training.train --method cosent --resume runs/<run> [--allow-config-change ...]

`make train-export METHOD=... [SELECT=...]` runs this. runs/<method>-<timestamp>/best/ is a
sentence-transformers directory; the export goes to models/<method>-<timestamp>/ with the training
config and dev score in its manifest (ONNX/torch parity checked, as every export).
A resume continues the run exactly with the run's own config (runs/<run>/config.json); options given
with it are changes, which training refuses unless --allow-config-change.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import datetime as dt
import json
import sys
from pathlib import Path

from core.cross_encoder import CrossEncoder, is_cross_encoder_dir
from core.data import DataNotFound
from core.default_model import model_label
from core.encoder import SentenceEncoder
from export.exporter import export_onnx
from training.config import PRESETS, TrainConfig, make_config
from training.objectives import METHODS
from training.resume import config_from_json
from training.selection import make_evaluator


def _parse_assignments(items: list[str]) -> dict:
    """key=value pairs; values are Python literals where they parse (3e-5, None, True), else strings."""
    out = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep:
            raise SystemExit(f"expected key=value, got {item!r}")
        try:
            out[key.strip()] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            out[key.strip()] = raw
    return out


def build_config(argv: list[str] | None = None) -> TrainConfig:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--method", required=True, choices=METHODS)
    parser.add_argument("--preset", choices=sorted(PRESETS), help="default: quick (on --resume: the run's)")
    parser.add_argument("--base", dest="base_model", help="base model: HF/sentence-transformers dir or hub "
                        "name (default: the preset's; quick = the embedded all-MiniLM-L6-v2)")
    parser.add_argument("--data-dir", type=Path, help="folder holding the training/dev data sources")
    parser.add_argument("--train-data", help="training source, see core.data.load_examples")
    parser.add_argument("--max-steps", type=int)
    parser.add_argument("--select", help="what picks the best checkpoint: stsb-dev (default), "
                        "retrieval:<BEIR folder>[:split] (nDCG@10), pairs:<tsv of sentence1, sentence2, score> "
                        "(Spearman), last")
    parser.add_argument("--no-export", dest="export", action="store_false",
                        help="train and keep runs/<run>/best only (no ONNX export): for ablations")
    parser.add_argument("--resume", type=Path, help="run directory to resume from, with its config")
    parser.add_argument("--allow-config-change", action="store_true",
                        help="resume even though the options given change the run's config")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help=f"any TrainConfig field: {', '.join(f.name for f in dataclasses.fields(TrainConfig))}")
    parser.add_argument("--objective", nargs="*", default=[], metavar="KEY=VALUE",
                        help="fields of the objective's settings dataclass (its paper's hyper-parameters)")
    args = parser.parse_args(argv)
    overrides = _parse_assignments(args.set)
    for name in ("base_model", "data_dir", "train_data", "max_steps", "resume", "select"):
        if getattr(args, name) is not None:
            overrides[name] = getattr(args, name)
    if args.allow_config_change:
        overrides["allow_config_change"] = True
    for name in ("data_dir", "runs_dir", "models_dir", "resume"):
        if isinstance(overrides.get(name), str):
            overrides[name] = Path(overrides[name])
    objective = _parse_assignments(args.objective)
    if args.resume is None:
        return make_config(args.method, args.preset or "quick", objective=objective, **overrides)
    saved = config_from_json(TrainConfig, json.loads((args.resume / "config.json").read_text()))
    if args.method != saved.method or args.preset not in (None, saved.preset):
        raise SystemExit(f"{args.resume} is a {saved.method} run with preset {saved.preset}")
    unknown = set(overrides) - {f.name for f in dataclasses.fields(TrainConfig)}
    if unknown:
        raise SystemExit(f"unknown setting(s) {sorted(unknown)}")
    saved = dataclasses.replace(saved, resume=None, allow_config_change=False)  # this session's, not the run's
    return dataclasses.replace(saved, objective={**dataclasses.asdict(saved.objective), **objective}, **overrides)


def train_and_export(cfg: TrainConfig, log=print, export: bool = True) -> Path | None:
    """The export directory (None on ranks other than 0 of a multi-process run, or without `export`)."""
    from training.trainer import train

    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = cfg.resume or cfg.runs_dir / f"{cfg.method}-{stamp}"
    result = train(cfg, run_dir, log=log, evaluator=make_evaluator(cfg.select, cfg.data_dir))
    if not result.is_main or not export:
        return None
    load = CrossEncoder if is_cross_encoder_dir(result.best_dir) else SentenceEncoder
    encoder = load.from_pretrained(result.best_dir)
    encoder.base_model = model_label(cfg.base_model)
    export_dir = cfg.models_dir / f"{cfg.method}-{stamp}"
    training_info = {
        "config": cfg.to_json(),
        "run_dir": str(run_dir),
        "best_step": result.best_step,
        "steps": result.steps,
        "seconds": round(result.seconds, 1),
        "select": result.dev_metric,
        "dev_score": round(result.best_dev, 4),
        "dev_score_before": round(result.initial_dev, 4),
    }
    manifest = export_onnx(encoder, export_dir, method=cfg.method, training=training_info, data_dir=cfg.data_dir)
    log(f"[export] {export_dir} (dim {manifest.dimension}, parity {manifest.parity_max_abs_diff:.1e}); "
        f"{result.dev_metric} {result.initial_dev:.2f} → {result.best_dev:.2f}")
    log(f"serve it with: make serve MODEL_DIR={export_dir}")
    return export_dir


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        train_and_export(build_config(argv), export="--no-export" not in argv)
    except DataNotFound as e:  # says which command gets the data: a traceback would bury that
        raise SystemExit(f"error: {e}") from None
    return 0


if __name__ == "__main__":
    sys.exit(main())
