"""The code passes ruff (settings in pyproject.toml)."""

import subprocess
import sys
from pathlib import Path


def test_ruff_is_clean():
    repo = Path(__file__).resolve().parent.parent
    ruff = Path(sys.executable).parent / "ruff"
    result = subprocess.run([str(ruff), "check", "."], cwd=repo, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout
