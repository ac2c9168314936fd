"""CLSR: NT-Xent against numpy, the frozen transformer, the embedding cache, the exported encoder."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from core.data import PairExample
from core.encoder import SentenceEncoder
from training.objectives import clsr as clsr_mod
from training.objectives import get_objective
from training.objectives.clsr import CLSR, CLSRSettings, nt_xent

PAIRS = [
    PairExample("a man is playing a guitar .", "a man plays the guitar .", "a man is eating ."),
    PairExample("a woman is slicing an onion .", "a woman is cutting an onion ."),
    PairExample("a dog runs in the park .", "a dog is running on the grass ."),
    PairExample("the stock market fell today .", "shares dropped sharply ."),
]
CPU = torch.device("cpu")


def ref_nt_xent(za, zb, tau=0.1):
    """Eq. 1 literally: for every anchor a among the 2m sentences (pairs both ways), −log of
    exp(cos(a, b)/τ) over Σ_{i ≠ a} exp(cos(a, i)/τ); the mean over the 2m anchors."""
    v = np.concatenate([za, zb]).astype(np.float64)
    m = len(za)
    losses = []
    for a in range(2 * m):
        b = (a + m) % (2 * m)
        cos = [v[a] @ v[i] / (np.linalg.norm(v[a]) * np.linalg.norm(v[i])) for i in range(2 * m)]
        denom = sum(math.exp(cos[i] / tau) for i in range(2 * m) if i != a)
        losses.append(-math.log(math.exp(cos[b] / tau) / denom))
    return float(np.mean(losses)), losses


def test_nt_xent_matches_numpy():
    g = torch.Generator().manual_seed(0)
    za, zb = torch.randn(5, 7, generator=g, dtype=torch.float64), torch.randn(5, 7, generator=g, dtype=torch.float64)
    for tau in (0.1, 0.5):
        expected, _ = ref_nt_xent(za.numpy(), zb.numpy(), tau)
        assert nt_xent(za, zb, tau).item() == pytest.approx(expected, rel=1e-9)


def test_nt_xent_excludes_only_the_anchor_itself():
    # one pair: the positive is the only term left in the denominator, so the loss is exactly 0
    za, zb = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.3, 0.9]])
    assert nt_xent(za, zb).item() == pytest.approx(0.0, abs=1e-7)
    # two pairs, by hand: anchor a0's denominator holds b0 (positive), a1 and b1 (negatives), not a0
    za = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    zb = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    # every anchor: cos(pos) = 1, one negative with cos 0 twice (the other pair's two sentences)
    by_hand = -math.log(math.exp(10) / (math.exp(10) + 2 * math.exp(0)))
    assert nt_xent(za, zb).item() == pytest.approx(by_hand, rel=1e-12)


def test_nt_xent_distributed_offsets(monkeypatch):
    """Simulated rank 1 of 2: local anchors against all ranks' sentences, positives offset by rank·m."""
    g = torch.Generator().manual_seed(1)
    za_all, zb_all = (
        torch.randn(6, 4, generator=g, dtype=torch.float64),
        torch.randn(6, 4, generator=g, dtype=torch.float64),
    )
    m = 3
    parts = {"a": za_all[:m], "b": zb_all[:m]}
    order = iter(["a", "b"])  # nt_xent gathers za, then zb
    monkeypatch.setattr(clsr_mod, "is_distributed", lambda: True)
    monkeypatch.setattr(clsr_mod.dist, "get_rank", lambda: 1)
    monkeypatch.setattr(clsr_mod, "gather_with_grad", lambda t: torch.cat([parts[next(order)], t]))
    got = nt_xent(za_all[m:], zb_all[m:]).item()
    _, per_anchor = ref_nt_xent(za_all.numpy(), zb_all.numpy())
    rank1 = [per_anchor[i] for i in (3, 4, 5, 9, 10, 11)]  # rank 1's anchors in the global 2M
    assert got == pytest.approx(float(np.mean(rank1)), rel=1e-9)


def test_defaults_and_registry(tiny_encoder):
    assert get_objective("clsr") is CLSR
    obj = CLSR(tiny_encoder)
    assert obj.data_kind == "pairs" and obj.batch_sampler is None
    assert obj.temperature == 0.1 and obj.encoder.pooling == "mean"
    lin = [m for m in obj.e if isinstance(m, torch.nn.Linear)]
    assert [(x.in_features, x.out_features) for x in lin] == [(32, 768), (768, 768)]
    assert isinstance(obj.e[1], torch.nn.ReLU) and len(obj.e) == 3
    assert isinstance(obj.h, torch.nn.Linear) and (obj.h.in_features, obj.h.out_features) == (768, 768)
    assert isinstance(CLSR(tiny_encoder, CLSRSettings(output_relu=True)).e[-1], torch.nn.ReLU)


def _counting(encoder):
    calls = []
    encoder.transformer.register_forward_hook(lambda *a: calls.append(1))
    return calls


def test_cache_built_once_and_used_by_collate(tiny_encoder):
    obj = CLSR(tiny_encoder, CLSRSettings(hidden_dim=16, out_dim=8, proj_dim=8, cache_batch_size=3))
    calls = _counting(tiny_encoder)
    obj.prepare(PAIRS, CPU)
    sentences = list(dict.fromkeys(s for p in PAIRS for s in (p.anchor, p.positive)))
    assert obj.cache_size == len(sentences) == 8  # hard negatives are not embedded
    assert len(calls) == math.ceil(8 / 3)
    obj.prepare(PAIRS, CPU)  # nothing new: no second pass
    assert len(calls) == math.ceil(8 / 3)

    batch = obj.collate(PAIRS[1:3])
    assert set(batch) == {"vectors"}
    expected = tiny_encoder.encode(
        [PAIRS[1].anchor, PAIRS[2].anchor, PAIRS[1].positive, PAIRS[2].positive], normalize=False
    )
    n_calls = len(calls)
    np.testing.assert_allclose(batch["vectors"].numpy(), expected, rtol=1e-5, atol=1e-6)
    out = obj(batch)
    out["loss"].backward()
    assert len(calls) == n_calls  # forward and backward ran on the cached vectors only


def test_unseen_sentences_are_embedded_on_the_fly(tiny_encoder):
    obj = CLSR(tiny_encoder, CLSRSettings(hidden_dim=16, out_dim=8, proj_dim=8))
    obj.prepare(PAIRS[:3], CPU)
    cached = obj(obj.collate(PAIRS[:3]))["loss"]
    fresh = CLSR(tiny_encoder, CLSRSettings(hidden_dim=16, out_dim=8, proj_dim=8))
    fresh.load_state_dict(obj.state_dict())
    batch = fresh.collate(PAIRS[:3])  # empty cache: every sentence goes through the transformer
    assert batch["missing"].tolist() == list(range(6))
    assert fresh(batch)["loss"].item() == pytest.approx(cached.item(), rel=1e-5)


def test_transformer_is_frozen_and_gets_no_gradient(tiny_encoder):
    obj = CLSR(tiny_encoder, CLSRSettings(hidden_dim=16, out_dim=8, proj_dim=8))
    obj.train()
    assert not obj.encoder.training  # the frozen model never runs with dropout
    obj.prepare(PAIRS, CPU)
    batch = obj.collate(PAIRS + [PairExample("one more sentence .", "yet another sentence .")])
    assert "missing" in batch  # the on-the-fly path must not leak gradient either
    obj(batch)["loss"].backward()
    for name, p in obj.encoder.named_parameters():
        assert not p.requires_grad and p.grad is None, name
    for module in (obj.e, obj.h):
        for p in module.parameters():
            assert p.requires_grad and p.grad is not None and p.grad.abs().sum() > 0


def test_one_step_lowers_loss(tiny_encoder):
    torch.manual_seed(0)
    obj = CLSR(tiny_encoder)
    obj.prepare(PAIRS, CPU)
    batch = obj.collate(PAIRS)
    opt = torch.optim.SGD([p for p in obj.parameters() if p.requires_grad], lr=0.5)
    before = obj(batch)["loss"]
    opt.zero_grad()
    before.backward()
    opt.step()
    with torch.no_grad():
        assert obj(batch)["loss"].item() < before.item()


def test_inference_encoder_is_frozen_model_mean_pooling_and_e(tiny_encoder, tmp_path):
    obj = CLSR(tiny_encoder, CLSRSettings(hidden_dim=16, out_dim=8, proj_dim=6))
    obj.prepare(PAIRS, CPU)
    enc = obj.inference_encoder()
    assert isinstance(enc, SentenceEncoder)
    assert enc.head is obj.e and enc.pooling == "mean" and enc.dim == 8
    assert enc.transformer is tiny_encoder.transformer
    texts = [PAIRS[0].anchor, PAIRS[3].positive]
    got = enc.encode(texts, normalize=False)
    with torch.no_grad():
        expected = obj.e(obj.collate([PairExample(*texts)])["vectors"]).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    # round trip through the saved directory (its Dense modules hold e)
    enc.save_pretrained(tmp_path / "clsr")
    loaded = SentenceEncoder.from_pretrained(tmp_path / "clsr")
    assert loaded.pooling == "mean" and loaded.dim == 8
    np.testing.assert_allclose(loaded.encode(texts, normalize=False), got, rtol=1e-5, atol=1e-6)


def test_inference_encode_keeps_the_frozen_model_in_eval(tiny_encoder):
    obj = CLSR(tiny_encoder, CLSRSettings(hidden_dim=16, out_dim=8, proj_dim=8)).train()
    obj.inference_encoder().encode(["a sentence ."])
    assert not tiny_encoder.transformer.training


def test_base_model_with_its_own_head(tiny_encoder):
    torch.manual_seed(0)
    tiny_encoder.head = torch.nn.Linear(32, 12)  # e.g. an SBERT with a Dense layer: part of the frozen m
    obj = CLSR(tiny_encoder, CLSRSettings(hidden_dim=16, out_dim=8, proj_dim=8))
    assert obj.e[0].in_features == 12 and not tiny_encoder.head.weight.requires_grad
    obj.prepare(PAIRS[:1], CPU)
    enc = obj.inference_encoder()
    assert enc.dim == 8
    with torch.no_grad():
        expected = obj.e(obj.collate(PAIRS[:1])["vectors"][:1]).numpy()
    np.testing.assert_allclose(enc.encode([PAIRS[0].anchor], normalize=False), expected, rtol=1e-5, atol=1e-6)


def test_checkpoint_holds_the_head_only(tiny_encoder):
    torch.manual_seed(0)
    obj = CLSR(tiny_encoder, CLSRSettings(hidden_dim=16, out_dim=8, proj_dim=8))
    state = obj.checkpoint_state_dict()
    assert set(state) == {k for k in obj.state_dict() if k.startswith(("e.", "h."))}
    assert not any(k.startswith("encoder.") for k in state)
    obj.prepare(PAIRS, CPU)
    batch = obj.collate(PAIRS)
    torch.manual_seed(1)
    fresh = CLSR(tiny_encoder, CLSRSettings(hidden_dim=16, out_dim=8, proj_dim=8))  # other random e and h
    assert fresh(batch)["loss"].item() != pytest.approx(obj(batch)["loss"].item())
    fresh.load_checkpoint_state_dict(state)
    assert fresh(batch)["loss"].item() == pytest.approx(obj(batch)["loss"].item(), rel=1e-6)
    with pytest.raises(RuntimeError, match="h.weight"):
        fresh.load_checkpoint_state_dict({k: v for k, v in state.items() if k != "h.weight"})
    with pytest.raises(RuntimeError, match="g.weight"):
        fresh.load_checkpoint_state_dict({**state, "g.weight": state["h.weight"]})
    fresh.load_checkpoint_state_dict(obj.state_dict())  # a full state dict (older checkpoints) still loads


def _tiny_clsr_data(root, pairs=40):
    """A SimCSE-style NLI CSV of distinct positive pairs and a 20-pair STS-B dev for model selection."""
    words = "man woman dog cat child car boat bird horse girl".split()
    verbs = "runs sits eats plays sleeps jumps".split()
    lines = ["sent0,sent1"] + [f"a {words[i % 10]} {verbs[i % 6]} {i} .,the {words[i % 10]} {verbs[i % 6]} ." for i in
                               range(pairs)]
    (root / "nli.csv").write_text("\n".join(lines) + "\n")
    (root / "STSBenchmark").mkdir()
    rows = [f"g\tf\t2012\t{i:04d}\t{i % 6}\ta {words[i % 10]} {verbs[i % 6]} .\ta {words[(i * 3) % 10]} runs ."
            for i in range(20)]
    (root / "STSBenchmark" / "sts-dev.csv").write_text("\n".join(rows) + "\n")


def test_training_evaluates_per_epoch_with_lars_and_checkpoints_the_head(tiny_model_dir, tmp_path):
    import json

    from training.config import make_config
    from training.trainer import train

    _tiny_clsr_data(tmp_path)
    common = dict(base_model=str(tiny_model_dir), data_dir=tmp_path, train_data="nli-csv:nli.csv", batch_size=8,
                  optimizer="lars", lr=0.5, weight_decay=1e-4, eval_unit="epochs", eval_every=1, warmup_ratio=0.0,
                  objective={"hidden_dim": 16, "out_dim": 8, "proj_dim": 8})
    run = tmp_path / "run"
    result = train(make_config("clsr", "paper", epochs=3, **common), run, log=lambda *_: None)
    assert result.steps == 15  # 40 pairs, batches of 8: 5 steps an epoch
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "dev" in r] == [0, 5, 10, 15]

    state = torch.load(run / "checkpoint.pt", weights_only=True)  # no pickled objects
    assert state["objective"] and all(k.startswith(("e.", "h.")) for k in state["objective"])
    decay, no_decay = state["optimizer"]["param_groups"]
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (1e-4, 0.0)
    assert decay["lars_adapt"] and not no_decay["lars_adapt"]
    assert len(decay["params"]) == 3 and len(no_decay["params"]) == 3  # e's and h's weights / biases
    assert (run / "best").is_dir()  # the exported model still holds the frozen encoder and e

    # more epochs is a changed config (the cosine schedule stretches): allowed explicitly
    resumed = train(make_config("clsr", "paper", epochs=4, resume=run, allow_config_change=True, **common), run,
                    log=lambda *_: None)
    assert resumed.steps == 20
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "dev" in r] == [0, 5, 10, 15, 20]


def test_paper_preset_is_the_papers_setting(tmp_path):
    from core.data import load_examples
    from tests.test_training_data import MNLI_ROWS, SNLI_ROWS, _write_nli_jsonl
    from training.config import make_config

    cfg = make_config("clsr", "paper")
    assert (cfg.batch_size, cfg.lr, cfg.weight_decay, cfg.epochs, cfg.schedule) == (512, 0.5, 1e-4, 2000, "cosine")
    assert cfg.optimizer == "lars" and (cfg.eval_unit, cfg.eval_every) == ("epochs", 1)
    # its data: every entailment pair of SNLI and MultiNLI train (§4.1: 314,315 of them)
    _write_nli_jsonl(tmp_path)
    pairs = load_examples("pairs", cfg.train_data, tmp_path)
    entailments = [(p, h) for rows in (SNLI_ROWS["train"], MNLI_ROWS["train"]) for p, h, y in rows if y == "entailment"]
    assert [(p.anchor, p.positive) for p in pairs] == entailments


def test_identity_init_starts_at_the_base_model_and_saves_as_dense(tiny_encoder, tmp_path):
    texts = [PAIRS[0].anchor, PAIRS[3].positive]
    tiny_encoder.pooling = "mean"
    base = tiny_encoder.encode(texts, normalize=False)
    obj = CLSR(tiny_encoder, CLSRSettings(identity_init=True, proj_dim=6))
    enc = obj.inference_encoder()
    assert enc.dim == tiny_encoder.dim and obj.h.in_features == tiny_encoder.dim
    np.testing.assert_allclose(enc.encode(texts, normalize=False), base, rtol=1e-5, atol=1e-6)
    enc.save_pretrained(tmp_path / "clsr")
    np.testing.assert_allclose(SentenceEncoder.from_pretrained(tmp_path / "clsr").encode(texts, normalize=False),
                               base, rtol=1e-5, atol=1e-6)
    obj.prepare(PAIRS, CPU)
    obj.train()
    obj(obj.collate(PAIRS))["loss"].backward()  # e trains from there
    assert obj.e[0].weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="output_relu"):
        CLSR(tiny_encoder, CLSRSettings(identity_init=True, output_relu=True))


def test_the_training_guides_supervised_recipe_is_the_quick_preset_without_a_hand_set_lr():
    """The training guide's CLSR command on the supervised twin (docs/training.md) runs the quick preset's own lr
    (the one that gained there, RESULTS.md issue 23), so the user who types it needs no --set lr= and the preset
    and the guide cannot drift."""
    import re
    import shlex
    from pathlib import Path

    from training.config import make_config
    from training.train import build_config

    guide = (Path(__file__).resolve().parent.parent / "docs" / "training.md").read_text()
    recipe = guide[guide.index("## Recipe: adapt a model to your own text"):guide.index("## How a run works")]
    command = re.search(r"make train-export METHOD=clsr SELECT=(\S+) \\\s*ARGS='([^']*)'", recipe)
    assert command, "the training guide's recipe has no `make train-export METHOD=clsr SELECT=... ARGS='...'` command"
    select, args = command.groups()
    cfg = build_config(["--method", "clsr", "--preset", "quick", "--select", select, *shlex.split(args)])
    preset = make_config("clsr")
    assert "lr=" not in args and cfg.lr == preset.lr == 3e-4
    assert cfg.objective == preset.objective and cfg.objective.identity_init
    assert cfg.train_data.startswith("nli-csv:") and cfg.select.startswith("retrieval:")
