"""The service image ships without torch: importing and running it must never import torch."""

import subprocess
import sys


def test_service_runs_without_importing_torch(default_export):
    code = f"""
import sys
sys.modules["torch"] = None  # any `import torch` now raises ImportError
from fastapi.testclient import TestClient
from tests.inprocess import app_in_process
from service.settings import Settings
with TestClient(app_in_process(Settings(model_dir={str(default_export)!r}))) as c:
    r = c.post("/embed", json={{"inputs": ["hello"]}})
    assert r.status_code == 200 and len(r.json()[0]) == 384, r.text
    c.post("/index/documents", json={{"documents": [{{"id": "1", "text": "hello"}}]}})
    assert c.post("/search", json={{"query": "hello"}}).json()["results"][0][0]["id"] == "1"
print("ok")
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
