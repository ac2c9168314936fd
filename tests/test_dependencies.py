"""deptry: every third-party import is declared (not reached through another package), and every declared
dependency is imported somewhere; the dev tools are imported by none of the packages ([tool.deptry])."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_declared_dependencies_are_the_imported_ones():
    deptry = Path(sys.executable).parent / "deptry"
    result = subprocess.run([str(deptry), "."], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
