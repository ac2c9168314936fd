"""The import contracts in pyproject.toml ([tool.importlinter]) hold, and they catch what they claim to.

lint-imports reads every import statement, those inside functions included, so a lazy import that
turns a one-way dependency into a cycle fails here as a top-level one would.
"""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("core", "export", "training", "evaluation", "benchmarks", "service")


def _lint_imports(cwd: Path) -> subprocess.CompletedProcess:
    tool = Path(sys.executable).parent / "lint-imports"
    return subprocess.run([str(tool), "--no-cache"], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin"})


def test_the_contracts_hold():
    result = _lint_imports(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "6 kept, 0 broken" in result.stdout


@pytest.fixture
def tree(tmp_path):
    """A copy of the packages' sources and the contracts, to break on purpose."""
    for name in PACKAGES:
        shutil.copytree(REPO / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    return tmp_path


@pytest.mark.parametrize(("module", "line", "contract"), [
    # the cycle issue 21 found: model selection reaching up into the harness, inside a function
    ("training/selection.py", "def _lazy():\n    from evaluation import sts  # noqa\n",
     "benchmarks above training"),
    ("core/encoder.py", "def _lazy():\n    import training.trainer  # noqa\n", "benchmarks above training"),
    ("service/settings.py", "import torch  # noqa\n", "service imports only service"),
    ("service/settings.py", "def _lazy():\n    from core import data  # noqa\n", "service imports only service"),
    ("evaluation/sts.py", "def _lazy():\n    from benchmarks import machine  # noqa\n", "nothing imports benchmarks"),
    ("core/data.py", "def _lazy():\n    from service import manifest  # noqa\n", "core knows nothing of the serving"),
    ("core/beir.py", "def _lazy():\n    from core import ranking  # noqa\n", "no import cycles"),
    ("service/index/base.py", "def _lazy():\n    from service.index import local  # noqa\n", "no import cycles"),
    # the process split: an API process never holds the engine's code, nor the engine the API's
    ("service/api/registry.py", "def _lazy():\n    from service.engine import core  # noqa\n",
     "service: api and engine never import each other"),
    ("service/engine/core.py", "def _lazy():\n    from service.api import client  # noqa\n",
     "service: api and engine never import each other"),
])
def test_a_forbidden_import_breaks_its_contract(tree, module, line, contract):
    with open(tree / module, "a") as f:
        f.write("\n\n" + line)
    result = _lint_imports(tree)
    assert result.returncode == 1, result.stdout
    broken = [row for row in result.stdout.splitlines() if row.endswith("BROKEN")]
    assert any(row.startswith(contract) for row in broken), result.stdout


def test_the_images_export_stage_copies_every_package_the_exporter_imports():
    import grimp

    graph = grimp.build_graph(*PACKAGES)
    needed = {m.split(".")[0] for m in graph.find_upstream_modules("export", as_package=True)} | {"export"}
    export_stage = (REPO / "Dockerfile").read_text().split("FROM ")[1]
    assert {p for p in needed if f"COPY {p} ./{p}" not in export_stage} == set()
