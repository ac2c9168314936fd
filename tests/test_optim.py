"""training/optim.py: no weight decay on biases / normalisation weights for every method, and LARS."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from training.objectives import METHODS, get_objective
from training.optim import LARS, build_optimizer, param_groups


def _norm_and_bias_names(model: nn.Module) -> set[str]:
    norms = {f"{m}.{p}" for m, mod in model.named_modules() if isinstance(mod, nn.LayerNorm | nn.BatchNorm1d)
             for p, _ in mod.named_parameters(recurse=False)}
    return norms | {n for n, _ in model.named_parameters() if n.rsplit(".", 1)[-1] == "bias"}


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("optimizer", ["adamw", "sgd", "lars"])
def test_no_decay_on_bias_and_layernorm_for_every_method(method, optimizer, tiny_encoder):
    objective = get_objective(method)(tiny_encoder)
    opt = build_optimizer(objective, optimizer, lr=1e-3, weight_decay=0.01)
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    names = {id(p): n for n, p in objective.named_parameters()}
    trainable = {n for n, p in objective.named_parameters() if p.requires_grad}
    got_decay = {names[id(p)] for p in decay["params"]}
    got_no_decay = {names[id(p)] for p in no_decay["params"]}
    assert got_decay | got_no_decay == trainable and not got_decay & got_no_decay
    assert got_no_decay == trainable & _norm_and_bias_names(objective)
    assert any("LayerNorm" in n for n in got_no_decay) or method == "clsr"  # CLSR trains only its MLP
    assert all(n.endswith("weight") for n in got_decay)
    if optimizer == "lars":
        assert decay["lars_adapt"] and not no_decay["lars_adapt"]


def test_frozen_and_tied_parameters():
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 3))
    model[0].requires_grad_(False)
    decay, no_decay = param_groups(model, 0.1)
    assert [p.shape for p in decay["params"]] == [torch.Size([3, 4])]  # model[2].weight only
    assert len(no_decay["params"]) == 3  # batch-norm weight and bias, model[2].bias; frozen model[0] absent
    tied = nn.Module()
    tied.a, tied.b = nn.Linear(2, 2), nn.Linear(2, 2)
    tied.b.weight = tied.a.weight
    decay, _ = param_groups(tied, 0.1)
    assert len(decay["params"]) == 1


def test_unknown_optimizer():
    with pytest.raises(ValueError, match="unknown optimizer"):
        build_optimizer(nn.Linear(2, 2), "adam", lr=1.0)


def _lars_reference(w, b, grads, lr, wd, eta=1e-3, mu=0.9):
    """SimCLR's LARS in numpy: w decayed and adapted, b (a bias) neither."""
    w, b = w.astype(np.float64).copy(), b.astype(np.float64).copy()
    vw, vb = np.zeros_like(w), np.zeros_like(b)
    for gw, gb in grads:
        gw = gw + wd * w
        trust = eta * np.linalg.norm(w) / np.linalg.norm(gw)
        vw = mu * vw + lr * trust * gw
        vb = mu * vb + lr * gb
        w, b = w - vw, b - vb
    return w, b


def test_lars_matches_simclr_update():
    torch.manual_seed(0)
    layer = nn.Linear(4, 3).double()
    w0, b0 = layer.weight.detach().numpy().copy(), layer.bias.detach().numpy().copy()
    opt = build_optimizer(layer, "lars", lr=0.5, weight_decay=1e-4)
    assert isinstance(opt, LARS)
    grads = []
    for step in range(3):
        x = torch.randn(5, 4, dtype=torch.float64)
        opt.zero_grad()
        (layer(x) ** 2).sum().mul(step + 1).backward()
        grads.append((layer.weight.grad.numpy().copy(), layer.bias.grad.numpy().copy()))
        opt.step()
    w, b = _lars_reference(w0, b0, grads, lr=0.5, wd=1e-4)
    np.testing.assert_allclose(layer.weight.detach().numpy(), w, rtol=1e-10)
    np.testing.assert_allclose(layer.bias.detach().numpy(), b, rtol=1e-10)


def test_lars_step_size_is_layer_wise_and_scale_free():
    """The adapted step is lr·η·‖w‖ in length whatever the gradient's scale; a bias's is not."""
    def first_update(scale):
        torch.manual_seed(0)
        layer = nn.Linear(6, 6)
        before = [p.detach().clone() for p in (layer.weight, layer.bias)]
        opt = LARS(param_groups(layer, 0.0), lr=1.0)
        (layer(torch.randn(8, 6)).sum() * scale).backward()
        opt.step()
        return [p.detach() - q for p, q in zip((layer.weight, layer.bias), before, strict=True)], before

    (dw1, db1), (w, _) = first_update(1.0)
    (dw2, db2), _ = first_update(1000.0)
    torch.testing.assert_close(dw1, dw2)
    assert dw1.norm().item() == pytest.approx(1e-3 * w.norm().item(), rel=1e-5)
    torch.testing.assert_close(db2, 1000.0 * db1)


def test_lars_zero_weight_or_gradient_takes_the_plain_step():
    p = nn.Parameter(torch.zeros(3))
    opt = LARS([p], lr=0.1)
    p.grad = torch.tensor([1.0, 2.0, 3.0])
    opt.step()  # ‖w‖ = 0: trust ratio 1, a plain SGD step
    torch.testing.assert_close(p.detach(), torch.tensor([-0.1, -0.2, -0.3]))
    before = p.detach().clone()
    p.grad = torch.zeros(3)
    opt.step()  # ‖g‖ = 0: momentum alone moves it (0.9 × the last step)
    torch.testing.assert_close(p.detach() - before, torch.tensor([-0.09, -0.18, -0.27]))
