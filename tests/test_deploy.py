"""Deployment files, checked offline with real linters (no Docker engine or cluster here)."""

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def run(*cmd, **kw):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=REPO, timeout=120, **kw)


def test_dockerfile_passes_hadolint(tmp_path):
    assert run(BIN / "hadolint", "Dockerfile").returncode == 0
    # The linter is live: a known-bad Dockerfile fails.
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get install curl\n")
    assert run(BIN / "hadolint", bad).returncode != 0


def test_runtime_image_has_no_torch():
    runtime = (REPO / "Dockerfile").read_text().split("AS runtime", 1)[1]
    assert "[train]" not in runtime and "torch" not in runtime.split("COPY --from")[0]
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert not any(d.startswith(("torch", "transformers", "sentence-transformers")) for d in deps)


def test_yaml_files_pass_yamllint():
    result = run(BIN / "yamllint", "-s", "docker-compose.yml", "k8s", ".yamllint.yml")
    assert result.returncode == 0, result.stdout


def test_compose_file_matches_the_compose_spec():
    # tests/fixtures/compose_spec.json: the Compose Specification schema as shipped in docker-compose 1.29.2.
    schema = json.loads((REPO / "tests/fixtures/compose_spec.json").read_text())
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    jsonschema.validate(compose, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"services": {"x": {"ports": "8080"}}}, schema)
    service = compose["services"]["sembed"]
    assert service["ports"] == ["8080:8080"]


def test_k8s_manifests_validate_against_the_api_schema():
    result = run(BIN / "kubernetes-validate", "--strict", *sorted((REPO / "k8s").glob("*.yaml")))
    assert result.returncode == 0, result.stdout + result.stderr


def test_k8s_probes_point_at_real_endpoints(live_service):
    import httpx

    deployment = yaml.safe_load((REPO / "k8s/deployment.yaml").read_text())
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert httpx.get(live_service.url + container[probe]["httpGet"]["path"]).status_code == 200


def test_constraints_pin_versions_not_local_files():
    # `pip freeze` writes "name @ file:///tmp/..." for a wheel installed from disk; a fresh machine
    # (CI, the Docker build) has no such file and the install fails.
    lines = [line.strip() for line in (REPO / "constraints.txt").read_text().splitlines()]
    pins = [line for line in lines if line and not line.startswith("#")]
    bad = [line for line in pins if " @ " in line or "==" not in line]
    assert pins and not bad, bad


def test_every_sembed_variable_in_the_deployment_files_is_a_setting():
    import re

    from service.settings import Settings

    fields = {f"SEMBED_{name.upper()}" for name in Settings.model_fields}
    named = set()
    for path in ("Dockerfile", "docker-compose.yml", "k8s/deployment.yaml"):
        named |= set(re.findall(r"\bSEMBED_[A-Z_]+\b", (REPO / path).read_text()))
    named.discard("SEMBED_")
    assert named and named <= fields, sorted(named - fields)
