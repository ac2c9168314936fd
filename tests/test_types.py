"""mypy is clean on the shared layer (core/) and on the service (service/): [tool.mypy] in pyproject.toml, with
pydantic's plugin; libraries without types, and faiss's partial stubs, are read as Any."""

import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_core_and_service_type_check():
    files = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]["files"]
    assert {"core", "service"} <= set(files), files
    result = subprocess.run([sys.executable, "-m", "mypy"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
