"""mypy is clean on the shared layer (core/) and on the service (service/): [tool.mypy] in pyproject.toml, with
pydantic's plugin; libraries without types, and faiss's partial stubs, are read as Any. service/ipc and service/engine
are held to mypy --strict's checks (an override in pyproject.toml)."""

import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


#: `mypy --strict`'s per-module checks, which the process boundary and the engine keep (issue 42)
STRICT = {"disallow_untyped_defs", "disallow_incomplete_defs", "disallow_untyped_calls", "disallow_untyped_decorators",
          "disallow_any_generics", "disallow_subclassing_any", "warn_return_any", "no_implicit_reexport",
          "strict_equality"}


def test_core_and_service_type_check():
    mypy = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]
    assert {"core", "service"} <= set(mypy["files"]), mypy["files"]
    strict = [o for o in mypy["overrides"] if {"service.ipc.*", "service.engine.*"} <= set(o["module"])]
    assert strict and all(strict[0].get(flag) is True for flag in STRICT), strict
    result = subprocess.run([sys.executable, "-m", "mypy"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
