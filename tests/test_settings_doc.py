"""The settings reference is the settings class, and no document names a setting that does not exist."""

import re
from pathlib import Path

from service.settings import Settings, reference

REPO = Path(__file__).resolve().parent.parent


def test_the_reference_is_generated_from_the_class():
    assert (REPO / "docs" / "settings.md").read_text() == reference(), \
        "docs/settings.md is stale: python -m service.settings > docs/settings.md"
    assert all(field.description for field in Settings.model_fields.values())


def test_every_sembed_variable_a_document_names_exists():
    known = {f"SEMBED_{name.upper()}" for name in Settings.model_fields}
    files = [REPO / "README.md", REPO / "ARCHITECTURE.md", REPO / "docker-compose.yml", REPO / "Dockerfile",
             *(REPO / "docs").glob("*.md"), *(REPO / "k8s").rglob("*.yaml"), *(REPO / "deploy").rglob("*.*")]
    named = {(path.name, v) for path in files if path.is_file()
             for v in re.findall(r"SEMBED_[A-Z0-9_]*[A-Z0-9]", path.read_text(errors="ignore"))}
    assert not {(f, v) for f, v in named if v not in known}
