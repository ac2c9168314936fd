"""SimCSE: the loss against a numpy InfoNCE, the dropout views, the training-only MLP."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from numpy_reference import np_info_nce

from training.objectives import get_objective
from training.objectives.losses import info_nce
from training.objectives.simcse import SimCSE, SimCSESettings

TEXTS = [
    "A man is playing a guitar.",
    "The cat sleeps on the warm mat.",
    "Stocks fell sharply on Monday morning.",
    "She baked bread for the whole family.",
]


def test_registry_name():
    assert get_objective("simcse") is SimCSE
    assert SimCSE.data_kind == "unlabeled"


def test_info_nce_matches_numpy():
    rng = np.random.default_rng(0)
    q, k = rng.normal(size=(5, 8)), rng.normal(size=(5, 8))
    for tau in (0.05, 1.0):
        got = info_nce(torch.tensor(q), torch.tensor(k), tau).item()
        assert got == pytest.approx(np_info_nce(q, k, tau), rel=1e-5)


def test_loss_from_embeddings_applies_the_mlp(tiny_encoder):
    obj = SimCSE(tiny_encoder)
    rng = np.random.default_rng(1)
    z1, z2 = rng.normal(size=(4, 32)).astype(np.float32), rng.normal(size=(4, 32)).astype(np.float32)
    w = obj.mlp[0].weight.detach().numpy()
    b = obj.mlp[0].bias.detach().numpy()
    want = np_info_nce(np.tanh(z1 @ w.T + b), np.tanh(z2 @ w.T + b), 0.05)
    got = obj.loss_from_embeddings(torch.tensor(z1), torch.tensor(z2)).item()
    assert got == pytest.approx(want, rel=1e-4)


def test_forward_equals_numpy_on_cls_without_dropout(tiny_encoder):
    """With dropout off both views are identical: loss = InfoNCE(MLP(cls), MLP(cls))."""
    obj = SimCSE(tiny_encoder)
    obj.eval()
    batch = obj.collate(TEXTS)
    assert batch["features"]["input_ids"].shape[0] == 2 * len(TEXTS)
    with torch.no_grad():
        loss = obj(batch)["loss"].item()
        feats = tiny_encoder.tokenizer(TEXTS, padding=True, return_tensors="pt")
        cls = tiny_encoder.transformer(**feats).last_hidden_state[:, 0].numpy()
    w, b = obj.mlp[0].weight.detach().numpy(), obj.mlp[0].bias.detach().numpy()
    z = np.tanh(cls @ w.T + b)
    assert loss == pytest.approx(np_info_nce(z, z, 0.05), rel=1e-4)


def test_dropout_makes_two_different_views(tiny_encoder):
    obj = SimCSE(tiny_encoder)
    obj.train()
    torch.manual_seed(0)
    out = obj(obj.collate(TEXTS))
    assert out["pos_cos"].item() < 0.9999  # eval mode would give exactly 1
    obj.eval()
    assert obj(obj.collate(TEXTS))["pos_cos"].item() == pytest.approx(1.0, abs=1e-5)


def test_gradients_reach_encoder_and_mlp(tiny_encoder):
    obj = SimCSE(tiny_encoder)
    obj.train()
    obj(obj.collate(TEXTS))["loss"].backward()
    for name in ("mlp.0.weight", "encoder.transformer.embeddings.word_embeddings.weight"):
        grad = dict(obj.named_parameters())[name].grad
        assert grad is not None and grad.abs().sum() > 0, name


def test_a_few_steps_lower_the_loss(tiny_encoder):
    obj = SimCSE(tiny_encoder)
    obj.train()
    batch = obj.collate(TEXTS)
    opt = torch.optim.Adam([p for p in obj.parameters() if p.requires_grad], lr=1e-3)

    def loss():
        torch.manual_seed(123)  # the same dropout masks at every evaluation
        return obj(batch)["loss"]

    start = loss()
    for _ in range(2):
        opt.zero_grad()
        loss().backward()
        opt.step()
    assert loss().item() < start.item()


def test_inference_encoder_is_raw_cls_without_mlp(tiny_encoder):
    obj = SimCSE(tiny_encoder)
    enc = obj.inference_encoder()
    assert enc is tiny_encoder and enc.head is None and enc.pooling == "cls"
    feats = tiny_encoder.tokenize(TEXTS)
    enc.eval()
    with torch.no_grad():
        emb = enc(feats["input_ids"], feats["attention_mask"], feats["token_type_ids"])
        cls = enc.transformer(**feats).last_hidden_state[:, 0]
    torch.testing.assert_close(emb, cls)
    # the supervised-SimCSE variant keeps the MLP as the exported head
    kept = SimCSE(tiny_encoder, SimCSESettings(mlp_only_train=False)).inference_encoder()
    assert kept.head is not None and kept.transformer is tiny_encoder.transformer


def test_keywords_pooling_and_max_length(tiny_encoder):
    obj = SimCSE(tiny_encoder, SimCSESettings(pooling="mean", max_length=8))
    assert tiny_encoder.pooling == "mean"
    batch = obj.collate(["word " * 50])
    assert batch["features"]["input_ids"].shape == (2, 8)
    assert tiny_encoder.max_seq_length == 32  # training truncation leaves the served length alone
    assert SimCSE(tiny_encoder, SimCSESettings(max_length=1000)).max_length == tiny_encoder.max_seq_length
