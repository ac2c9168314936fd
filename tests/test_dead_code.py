"""vulture finds no dead code in any package (reviewed exceptions: tests/vulture_whitelist*.py)."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_no_dead_code():
    vulture = Path(sys.executable).parent / "vulture"
    # 60: vulture's lowest confidence, where unused functions, classes, methods and attributes show up
    result = subprocess.run([str(vulture), "core", "export", "training", "evaluation", "benchmarks", "service",
                             "tests/vulture_whitelist.py", "tests/vulture_whitelist_service.py",
                             "--min-confidence", "60"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
