#!/bin/sh
# The trainer (compose profile `trainer`, k8s/overlays/gpu's Job): train with METHOD, export into /models/trained, then ask
# the API at API_URL to serve the new export under its default model's name (POST /admin/models/<name>/reload).
# Without API_URL it only trains and exports. Keys: the first of SEMBED_API_KEYS / SEMBED_ADMIN_API_KEYS, else the
# first line of /run/secrets/{api_keys,admin_api_keys}; with no admin key the API's /admin/ is closed, so the export
# is kept and not reloaded (the log says so; the job still succeeds: training and export did).
set -eu
METHOD="${METHOD:-cosent}"
PRESET="${PRESET:-quick}"
MODELS="${MODELS:-/models/trained}"
make train-export METHOD="$METHOD" PRESET="$PRESET" ARGS="--set models_dir=$MODELS runs_dir=/data/runs ${TRAIN_ARGS:-}"
export_name="$(ls -1t "$MODELS" | grep "^$METHOD-" | head -n 1)"
echo "exported $MODELS/$export_name"
[ -n "${API_URL:-}" ] || exit 0
EXPORT="$export_name" python - <<'PY'
import json
import os
import urllib.request


def key(name):
    variable = [k.strip() for k in os.environ.get(f"SEMBED_{name.upper()}", "").split(",") if k.strip()]
    if variable:
        return variable[0]
    path = f"/run/secrets/{name}"
    lines = [line.strip() for line in open(path)] if os.path.exists(path) else []
    return next((line for line in lines if line and not line.startswith("#")), "")


def call(path, body=None, token=""):
    req = urllib.request.Request(os.environ["API_URL"] + path, method="POST" if body else "GET",
                                 data=json.dumps(body).encode() if body else None,
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


name = os.environ.get("RELOAD_MODEL") or call("/info", token=key("api_keys"))["models"][0]
if not key("admin_api_keys"):
    print(f"NOT RELOADED: no admin key (SEMBED_ADMIN_API_KEYS, or deploy/compose.keys.yml's admin_api_keys file), "
          f"so {os.environ['API_URL']}/admin/ is closed. The export is kept: once the API has an admin key, "
          f"POST /admin/models/{name}/reload with {{\"export\": \"{os.environ['EXPORT']}\"}}.")
    raise SystemExit(0)
answer = call(f"/admin/models/{name}/reload", {"export": os.environ["EXPORT"]}, token=key("admin_api_keys"))
print(f"reloaded {name}: {json.dumps(answer)}")
PY
