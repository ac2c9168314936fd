"""CoSENT: the ranking loss against an independent numpy computation, siamese and cross-encoder
(the cross-encoder's training, export and serving: tests/test_cross_encoder.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from core.data import ScoredPair
from training.objectives import cosent as cosent_mod
from training.objectives import get_objective
from training.objectives.cosent import CoSENT, CoSENTCrossEncoder, CoSENTSettings, cosent_loss

SENTS = [
    ("a man is playing a guitar .", "a man plays the guitar .", 4.8),
    ("a woman is slicing an onion .", "a woman is cutting an onion .", 4.2),
    ("a dog runs in the park .", "a cat sleeps on the sofa .", 0.4),
    ("the stock market fell today .", "shares dropped sharply .", 3.0),
    ("a child is riding a horse .", "a kid rides a pony .", 3.0),  # tie with the previous pair
    ("two men are fighting .", "a plane is taking off .", 0.0),
]
EXAMPLES = [ScoredPair(a, b, y) for a, b, y in SENTS]


def ref_cosent(scores, labels, lam=20.0) -> float:
    """Eq. 10 written out: log(1 + Σ_{label_a > label_b} exp(λ (s_b − s_a)))."""
    total = 0.0
    for a in range(len(scores)):
        for b in range(len(scores)):
            if labels[a] > labels[b]:
                total += math.exp(lam * (scores[b] - scores[a]))
    return math.log1p(total)


def np_cos(u, v):
    return (u * v).sum(-1) / (np.linalg.norm(u, axis=-1) * np.linalg.norm(v, axis=-1))


def test_loss_matches_numpy_with_ties():
    scores = [0.9, 0.3, 0.5, 0.5, -0.2]
    labels = [2.0, 1.0, 1.0, 1.0, 0.0]
    got = cosent_loss(torch.tensor(scores, dtype=torch.float64), torch.tensor(labels), scale=20.0).item()
    assert got == pytest.approx(ref_cosent(scores, labels), rel=1e-9)
    # by hand: the ranked pairs are 0>1, 0>2, 0>3, 0>4, 1>4, 2>4, 3>4 — the ties 1,2,3 add nothing
    by_hand = sum(
        math.exp(20 * (scores[b] - scores[a])) for a, b in [(0, 1), (0, 2), (0, 3), (0, 4), (1, 4), (2, 4), (3, 4)]
    )
    assert got == pytest.approx(math.log1p(by_hand), rel=1e-9)


def test_binary_labels_and_lambda():
    scores = [0.2, 0.7, -0.4, 0.1]
    labels = [1.0, 0.0, 1.0, 0.0]
    for lam in (1.0, 5.0, 20.0):
        got = cosent_loss(torch.tensor(scores, dtype=torch.float64), torch.tensor(labels), scale=lam).item()
        assert got == pytest.approx(ref_cosent(scores, labels, lam), rel=1e-9)


def test_all_equal_labels_give_exactly_zero_and_no_gradient():
    scores = torch.tensor([0.9, -0.5, 0.1], requires_grad=True)
    loss = cosent_loss(scores, torch.full((3,), 3.0))
    assert loss.item() == 0.0  # log(1)
    loss.backward()
    assert torch.equal(scores.grad, torch.zeros(3))


def test_registry_and_attributes(tiny_encoder):
    assert get_objective("cosent") is CoSENT
    assert CoSENT.data_kind == "scored" and CoSENT(tiny_encoder).batch_sampler is None
    assert get_objective("cosent-cross") is CoSENTCrossEncoder  # Eq. 11: a pair scorer, exported for /rerank
    obj = CoSENT(tiny_encoder)
    assert obj.scale == 20.0 and obj.encoder.pooling == "mean"
    tiny_encoder.pooling = "cls"
    assert CoSENT(tiny_encoder, CoSENTSettings(pooling=None)).encoder.pooling == "cls"  # None keeps the encoder's


def test_siamese_forward_matches_numpy(tiny_encoder):
    obj = CoSENT(tiny_encoder).eval()  # no dropout, so the reference below sees the same network
    batch = obj.collate(EXAMPLES)
    out = obj(batch)
    # independent reference: each side embedded on its own (siamese), cosine in numpy
    u = tiny_encoder.encode([e.sentence1 for e in EXAMPLES], normalize=False).astype(np.float64)
    v = tiny_encoder.encode([e.sentence2 for e in EXAMPLES], normalize=False).astype(np.float64)
    expected = ref_cosent(np_cos(u, v), [e.label for e in EXAMPLES])
    assert out["loss"].item() == pytest.approx(expected, rel=1e-4, abs=1e-4)
    assert out["loss"].item() > 0


def test_all_equal_batch_through_objective_is_zero(tiny_encoder):
    obj = CoSENT(tiny_encoder)
    same = [ScoredPair(e.sentence1, e.sentence2, 2.0) for e in EXAMPLES[:3]]
    out = obj(obj.collate(same))
    assert out["loss"].item() == 0.0
    out["loss"].backward()  # still a graph: the loop can call backward on any batch


def _one_step_lowers(obj, batch):
    torch.manual_seed(0)
    obj.eval()  # deterministic forward: dropout would make the two losses incomparable
    params = [p for p in obj.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=1e-3)
    before = obj(batch)["loss"]
    opt.zero_grad()
    before.backward()
    opt.step()
    with torch.no_grad():
        after = obj(batch)["loss"]
    assert after.item() < before.item()


def test_one_step_lowers_loss(tiny_encoder):
    obj = CoSENT(tiny_encoder)
    _one_step_lowers(obj, obj.collate(EXAMPLES))


def test_distributed_gather_ranks_the_global_batch(monkeypatch):
    """Simulated rank 1 of 2: the loss is the global batch's (the gather's backward and DDP's
    average turn it into this rank's share of the gradient; tests/test_distributed.py)."""
    other = torch.tensor([0.1, 0.8, -0.3])
    other_labels = torch.tensor([1.0, 3.0, 0.0])
    local = torch.tensor([0.5, 0.2, 0.4], requires_grad=True)
    labels = torch.tensor([2.0, 1.0, 2.0])

    others = iter([other, other_labels])  # _gathered_loss gathers the scores, then the labels

    def fake_gather(t):
        return torch.cat([next(others), t])

    monkeypatch.setattr(cosent_mod, "is_distributed", lambda: True)
    monkeypatch.setattr(cosent_mod, "gather_with_grad", fake_gather)
    got = cosent_mod._gathered_loss(local, labels, 20.0)
    expected = ref_cosent(other.tolist() + local.tolist(), other_labels.tolist() + labels.tolist())
    assert got.item() == pytest.approx(expected, rel=1e-5)


# --- cross-encoder (Eq. 11) -------------------------------------------------------------------


def test_cross_encoder_reads_the_pair_and_matches_numpy(tiny_encoder):
    model = CoSENTCrossEncoder(tiny_encoder).eval()
    scorer = model.inference_encoder()
    batch = model.collate(EXAMPLES)
    feats = batch["features"]
    # one sequence per pair: [CLS] s1 [SEP] s2 [SEP], the second segment marked by token type 1
    assert feats["input_ids"].shape[0] == len(EXAMPLES)
    assert (feats["token_type_ids"] == 1).any(dim=1).all()
    logits = scorer(**feats)
    assert logits.shape == (len(EXAMPLES),)
    # the logit is linear(CLS) of the pair encoding, computed here by hand
    cls = tiny_encoder.transformer(**feats).last_hidden_state[:, 0]
    by_hand = cls @ scorer.classifier.weight[0] + scorer.classifier.bias[0]
    assert torch.allclose(logits, by_hand, atol=1e-5)
    out = model(batch)
    expected = ref_cosent(logits.tolist(), [e.label for e in EXAMPLES])
    assert out["loss"].item() == pytest.approx(expected, rel=1e-4)
    scores = scorer.score_pairs([e.sentence1 for e in EXAMPLES], [e.sentence2 for e in EXAMPLES])
    assert np.allclose(scores, logits.detach().numpy(), atol=1e-5)


def test_cross_encoder_one_step_lowers_loss(tiny_encoder):
    model = CoSENTCrossEncoder(tiny_encoder)
    _one_step_lowers(model, model.collate(EXAMPLES))
