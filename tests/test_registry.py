"""The model registry: built from settings, looked up by name, one or several exports."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError

from service.api.registry import ModelNotFound
from service.settings import Settings
from tests.inprocess import registry_from_settings


def test_several_models_from_one_setting():
    settings = Settings(backend="fake", models="small=exports/a, large=exports/b")
    assert [(n, str(p)) for n, p in settings.model_dirs()] == [("small", "exports/a"), ("large", "exports/b")]
    registry = registry_from_settings(settings)
    try:
        assert registry.names() == ["small", "large"] and registry.default == "small"
        assert registry.get() is registry.get("small") and registry.get("large") is not registry.get("small")
        assert registry.name_of(registry.get("large")) == "large" and registry.ready
        with pytest.raises(ModelNotFound, match="no model named 'medium'"):
            registry.get("medium")
    finally:
        asyncio.run(registry.close())
    assert not registry.ready


@pytest.mark.parametrize("spec", ["nodir", "a=x,a=y", "=x", "a="])
def test_malformed_model_lists_are_refused_at_start(spec):
    with pytest.raises(ValidationError):
        Settings(models=spec)


def test_the_default_is_the_single_export_under_its_own_name(default_export):
    registry = registry_from_settings(Settings(model_dir=default_export))
    try:
        assert registry.names() == ["all-MiniLM-L6-v2"]
        assert registry.get().info.dimension == 384
    finally:
        asyncio.run(registry.close())
