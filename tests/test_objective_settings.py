"""Each objective's settings are a dataclass beside it (the paper's defaults), built from presets and
`--objective key=value`, with unknown keys and wrong types refused by name."""

import dataclasses

import pytest

from training.config import make_config
from training.objectives import METHODS, get_objective, make_settings
from training.objectives.clsr import CLSRSettings
from training.objectives.cosent import CoSENTSettings
from training.objectives.infocse import InfoCSESettings
from training.objectives.simcse import SimCSESettings
from training.resume import config_from_json
from training.train import build_config


@pytest.mark.parametrize("method", METHODS)
def test_every_method_has_a_frozen_settings_dataclass_and_the_config_holds_it(method):
    settings_type = get_objective(method).settings_type
    assert dataclasses.is_dataclass(settings_type) and settings_type.__dataclass_params__.frozen
    cfg = make_config(method, "paper")
    assert isinstance(cfg.objective, settings_type)
    assert config_from_json(type(cfg), cfg.to_json()).to_json() == cfg.to_json()  # what a run's config.json holds


def test_defaults_are_the_papers():
    assert SimCSESettings().temperature == 0.05 and SimCSESettings().pooling == "cls"  # SimCSE §3, Eq. 3
    assert CoSENTSettings().scale == 20.0  # CoSENT's λ
    assert (CLSRSettings().temperature, CLSRSettings().out_dim) == (0.1, 768)  # CLSR §4.1
    assert (InfoCSESettings().aux_weight, InfoCSESettings().mask_rate) == (1e-5, 0.4)  # InfoCSE §4


def test_command_line_overrides_build_the_settings():
    cfg = build_config(["--method", "cosent", "--objective", "scale=10", "pooling=cls"])
    assert cfg.objective == CoSENTSettings(scale=10.0, pooling="cls")
    cfg = build_config(["--method", "infocse", "--preset", "quick", "--objective", "stage1_steps=5"])
    assert (cfg.objective.stage1_steps, cfg.objective.pooling) == (5, "mean")  # the preset's override is kept


def test_an_unknown_key_is_named():
    with pytest.raises(ValueError, match=r"unknown SimCSESettings setting\(s\) \['temprature'\]; known: temperature"):
        build_config(["--method", "simcse", "--objective", "temprature=0.1"])


@pytest.mark.parametrize("value", ["abc", "True", "[1]"])
def test_a_value_of_the_wrong_type_is_refused(value):
    with pytest.raises(ValueError, match="SimCSESettings.temperature must be float"):
        build_config(["--method", "simcse", "--objective", f"temperature={value}"])


def test_settings_of_another_objective_are_refused():
    with pytest.raises(ValueError, match="simcse takes SimCSESettings, not CoSENTSettings"):
        make_settings("simcse", CoSENTSettings())
