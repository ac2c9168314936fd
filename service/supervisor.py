"""`python -m service`: the process model, started and kept running.

    sembed: supervisor            binds the HTTP port, starts and restarts the others
    ├── sembed: engine <model> <device>   one per model and device: admission, queue, backend
    ├── sembed: index                     the local index's one writer (WAL, snapshots, FAISS)
    └── sembed: api 1..N                  uvicorn + FastAPI on the shared port: HTTP, auth,
                                          validation, tokenisation, answers; no model

The API processes share the listening socket the supervisor bound (the kernel spreads
connections over them) and reach the engines over Unix sockets and the index over ZeroMQ sockets in a
private run directory. A process that dies is started again: an engine's in-flight requests get 503 as its
connections close (a hung one's within a second, from the API processes' heartbeat), and they reconnect to
its successor by themselves.
SIGTERM or Ctrl-C: the API processes stop being ready, drain their in-flight requests and exit,
then the engines and the index finish what they hold; the supervisor exits 0.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import msgspec

from service.api.auth import ApiKeys
from service.api.topology import ModelEndpoint, Topology
from service.ipc import control
from service.manifest import StaleExport
from service.settings import MEMORY_ONLY, Settings

log = logging.getLogger("sembed.supervisor")

#: how often the supervisor looks at its children, and how soon after a crash it restarts one
POLL_S = 0.1
RESTART_BACKOFF_S = 0.5


def _title(title: str) -> None:
    import setproctitle

    setproctitle.setproctitle(title)
    _die_with_parent()


def _die_with_parent() -> None:
    """A child of a supervisor that was killed outright goes too, rather than keep serving unsupervised
    (holding the port and the index files a restarted supervisor needs)."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the supervisor's own shutdown still stops them
        return
    parent = multiprocessing.parent_process()
    if parent is not None and os.getppid() != parent.pid:  # it died while this process was starting
        os._exit(1)


def _logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(processName)s %(name)s: %(message)s")
    access = logging.getLogger("sembed.access")  # bare JSON lines, for log shippers
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    access.addHandler(handler)
    access.propagate = False


def engine_main(settings: Settings, export_dir: str, endpoint: str, title: str, error_file: str) -> None:
    _title(title)
    _logging()
    from service.engine import socket_server

    try:
        socket_server.run(settings, export_dir, endpoint)
    except Exception as e:  # a reload names the reason to its caller
        Path(error_file).write_text(f"{type(e).__name__}: {e}")
        raise


def index_main(settings: Settings, endpoint: str) -> None:
    _title("sembed: index")
    _logging()
    from service.index import remote

    remote.run(settings, endpoint)


def api_main(settings: Settings, topology: Topology, listener: socket.socket, number: int) -> None:
    _title(f"sembed: api {number}")
    _logging()
    # The API processes are the parallelism: a tokenizers thread pool in each (a thread per core) only
    # oversubscribes the cores: the pools cost server CPU per sentence (make bench-frontend; RESULTS.md,
    # "The server's own CPU").
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from service.api.app import create_app
    from service.api.http_server import build_server
    from service.process import settle_memory

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the supervisor decides
    server = build_server(create_app(settings, topology=topology), settings)
    settle_memory()
    server.run(sockets=[listener])


@dataclass
class Child:
    title: str
    target: Callable[..., None]
    args: tuple
    process: multiprocessing.process.BaseProcess | None = None  # None until the supervisor starts it
    restarts: int = 0
    died_at: float | None = field(default=None)

    @property
    def started(self) -> multiprocessing.process.BaseProcess:
        """The process; the supervisor starts every child before it watches, restarts or stops it."""
        if self.process is None:
            raise RuntimeError(f"{self.title} was never started")
        return self.process


class Supervisor:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.run_dir = Path(tempfile.mkdtemp(prefix="sembed-"))
        self.context = multiprocessing.get_context("spawn")  # children start clean: no inherited threads
        self.children: list[Child] = []
        self.stopping = False
        self.generations = itertools.count()
        self.lock = threading.Lock()  # the children list: the control thread changes it on a reload
        self.staged: dict[int, tuple[ModelEndpoint, Child]] = {}

    def topology(self) -> tuple[Topology, list[Child]]:
        from service.engine.backends import served_name

        s = self.settings
        models, engines = [], []
        for name, export_dir in s.model_dirs():
            name = name or served_name(s.backend, export_dir)
            endpoint = f"ipc://{self.run_dir}/engine-{next(self.generations)}.sock"
            models.append(ModelEndpoint(name, str(export_dir), endpoint))
            engines.append(self._engine(name, str(export_dir), endpoint))
        index_endpoint = f"ipc://{self.run_dir}/index.sock" if s.index_needs_writer_process() else None
        if index_endpoint:
            engines.append(Child("sembed: index", index_main, (s, index_endpoint)))
        return Topology(models, index_endpoint, f"ipc://{self.run_dir}/control.sock",
                        f"ipc://{self.run_dir}/events.sock", f"ipc://{self.run_dir}/acks.sock"), engines

    def _engine(self, name: str, export_dir: str, endpoint: str) -> Child:
        device = "cuda:0" if self.settings.device == "cuda" else "cpu"
        title = f"sembed: engine {name} {device}"
        return Child(title, engine_main, (self.settings, export_dir, endpoint, title, endpoint[6:] + ".error"))

    def run(self) -> int:
        s = self.settings
        metrics_dir = self.run_dir / "metrics"
        metrics_dir.mkdir()
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)  # inherited by every child
        _title("sembed: supervisor")
        topology, backends = self.topology()
        listener = socket.socket(socket.AF_INET6 if ":" in s.host else socket.AF_INET)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((s.host, s.port))
        listener.listen(2048)
        listener.set_inheritable(True)
        workers = s.api_worker_count()
        self.topology_now = topology
        api = [Child(f"sembed: api {i}", api_main, (s, topology, listener, i)) for i in range(1, workers + 1)]
        self.children = backends + api
        self.api = api
        threading.Thread(target=self._control, args=(topology,), name="control", daemon=True).start()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        log.info("starting %d API process(es), %d engine(s)%s on %s:%d (run dir %s)", workers, len(topology.models),
                 " and the index writer" if topology.index_endpoint else "", s.host, s.port, self.run_dir)
        index_dir = s.index_location()
        if s.index_backend == "local" and index_dir is not None:
            log.info("the index keeps its log and snapshots in %s", index_dir.resolve())
        for child in self.children:
            self._start(child)
        try:
            while not self.stopping:
                time.sleep(POLL_S)
                with self.lock:
                    for child in self.children:
                        if not child.started.is_alive() and not self.stopping:
                            self._restart(child)
            with self.lock:
                self._shutdown(api, [c for c in self.children if c not in api])
        finally:
            listener.close()
            shutil.rmtree(self.run_dir, ignore_errors=True)
        return 0

    # --- reloads: the control thread ----------------------------------------------------------------
    def _control(self, topology: Topology) -> None:
        """Answer the API processes' reload requests (service/ipc/control.py), one at a time."""
        import zmq

        handlers: dict[type, Callable[..., control.Reply]] = {
            control.Stage: self._stage, control.Switch: self._switch, control.Discard: self._discard}
        context: zmq.Context[zmq.Socket] = zmq.Context.instance()
        requests = context.socket(zmq.REP)
        requests.bind(topology.control_endpoint)
        events = context.socket(zmq.PUB)
        events.bind(topology.events_endpoint)
        acks = context.socket(zmq.PULL)
        acks.bind(topology.acks_endpoint)
        while True:
            reply: control.Reply
            try:
                request = control.decode_request(requests.recv())
            except msgspec.ValidationError as e:
                log.error("a malformed reload request: %s", e)
                reply = control.Failed(f"malformed reload request: {e}")
            else:
                try:
                    reply = handlers[type(request)](request, events, acks)
                except Exception as e:
                    log.exception("reload step %s failed", type(request).__name__)
                    reply = control.Failed(str(e))
            requests.send(control.encode(reply))

    def _stage(self, request: control.Stage, events, acks) -> control.Staged:
        """Start an engine for the export beside the serving one; answer once it is ready (or why not)."""
        from service.ipc.messages import Hello, encode
        from service.ipc.stream import ask

        token = next(self.generations)
        model = ModelEndpoint(request.name, request.export_dir, f"ipc://{self.run_dir}/engine-{token}.sock")
        child = self._engine(model.name, model.export_dir, model.endpoint)
        self._start(child)
        while ask(model.endpoint, encode(Hello(0)), timeout_s=0.1) is None:
            if not child.started.is_alive():
                error = Path(child.args[-1])
                raise RuntimeError(error.read_text() if error.exists() else f"the engine exited with "
                                                                              f"{child.started.exitcode}")
            time.sleep(0.1)
        self.staged[token] = (model, child)
        return control.Staged(token, model.endpoint)

    def _switch(self, request: control.Switch, events, acks) -> control.Switched:
        """Every API process moves to the staged engine; then the old one drains and stops."""
        token = request.token
        if token not in self.staged:
            raise KeyError(f"no staged engine {token}")
        model, child = self.staged.pop(token)
        with self.lock:
            self.children.append(child)
            alive = sum(c.started.is_alive() for c in self.api)
        events.send(control.encode(control.Switching(token, model.name, model.export_dir, model.endpoint)))
        waiting, deadline = alive, time.monotonic() + self.settings.shutdown_grace_s
        while waiting and time.monotonic() < deadline:
            # an acknowledgement left over from an earlier switch that timed out does not count for this one
            if acks.poll(100) and control.decode_acknowledged(acks.recv()).token == token:
                waiting -= 1
        with self.lock:
            self.topology_now = replace(self.topology_now, models=[model if m.name == model.name else m
                                                                    for m in self.topology_now.models])
            for api in self.api:  # an API process started later connects to the new engine
                api.args = (self.settings, self.topology_now, *api.args[2:])
            old = [c for c in self.children if c.title == child.title and c is not child]
            for c in old:
                self.children.remove(c)
        for c in old:
            self._retire(c)
        return control.Switched(token, waiting)

    def _discard(self, request: control.Discard, events, acks) -> control.Discarded:
        staged = self.staged.pop(request.token, None)
        if staged is not None:
            self._retire(staged[1])
        return control.Discarded(request.token)

    @staticmethod
    def _retire(child: Child) -> None:
        """An engine no longer served drains what it holds and exits; joined, so it leaves no zombie, and its
        metric files marked dead, so its last gauge values stop counting in /metrics (as after a restart)."""
        from prometheus_client import multiprocess

        process = child.started

        def wait() -> None:
            process.join()
            multiprocess.mark_process_dead(process.pid)

        process.terminate()
        threading.Thread(target=wait, daemon=True).start()

    def _on_signal(self, signum, frame) -> None:
        if self.stopping:  # a second signal: stop now
            for child in self.children:
                if child.process is not None and child.process.is_alive():
                    child.process.kill()
            raise SystemExit(1)
        log.info("%s: draining, then stopping", signal.Signals(signum).name)
        self.stopping = True

    def _start(self, child: Child) -> None:
        process = self.context.Process(target=child.target, args=child.args, name=child.title, daemon=False)
        child.process = process
        process.start()

    def _restart(self, child: Child) -> None:
        from prometheus_client import multiprocess

        process = child.started
        if child.died_at is None:
            child.died_at = time.monotonic()
            log.error("%s (pid %s) exited with %s: restarting it", child.title, process.pid, process.exitcode)
            multiprocess.mark_process_dead(process.pid)
        if time.monotonic() - child.died_at < RESTART_BACKOFF_S * min(child.restarts, 10):
            return
        child.restarts += 1
        child.died_at = None
        self._start(child)

    def _shutdown(self, api: list[Child], backends: list[Child]) -> None:
        s = self.settings
        # API processes first: they stop being ready, drain in-flight requests (which still need the engines)
        for group, grace in ((api, s.drain_delay_s + s.shutdown_grace_s + 5), (backends, s.shutdown_grace_s + 5)):
            for child in group:
                if child.started.is_alive():
                    child.started.terminate()
            deadline = time.monotonic() + grace
            for child in group:
                child.started.join(max(0.0, deadline - time.monotonic()))
                if child.started.is_alive():
                    log.warning("%s did not stop in time: killed", child.title)
                    child.started.kill()
                    child.started.join()
        log.info("stopped")


def main() -> None:
    from service.engine.backends import served_name

    _logging()
    settings = Settings()
    for _, export_dir in settings.model_dirs():
        try:  # here, once, not in an engine process its supervisor would restart (a backend that reads no export
            # checks nothing)
            served_name(settings.backend, export_dir)
        except FileNotFoundError:
            raise SystemExit(f"{export_dir} is not an export directory (no manifest.json); "
                             "create one with `make export` or set SEMBED_MODEL_DIR") from None
        except StaleExport as e:
            raise SystemExit(f"cannot serve {export_dir}: {e}") from e
    for warning in startup_warnings(settings):
        log.warning(warning)
    raise SystemExit(Supervisor(settings).run())


def api_keys(settings: Settings) -> ApiKeys:
    """The keys every API process will load; a key file that is named but unreadable stops the start, here, once
    (closed, not open: a missing file never means "no keys")."""
    try:
        return ApiKeys.load(settings.api_keys, settings.api_keys_file, admin_keys=settings.admin_api_keys,
                            admin_keys_file=settings.admin_api_keys_file)
    except OSError as e:
        raise SystemExit(f"cannot read an API key file ({e}): SEMBED_API_KEYS_FILE / SEMBED_ADMIN_API_KEYS_FILE "
                         "name a file that must exist; unset them to run without keys") from e


def startup_warnings(settings: Settings) -> list[str]:
    """What an operator should not learn from an incident: an open door, or an index that a restart empties."""
    warnings = []
    keys = api_keys(settings)
    if settings.host not in ("127.0.0.1", "::1", "localhost") and keys.open:
        admin = "open to the admin keys" if keys.admin_open else "closed (no SEMBED_ADMIN_API_KEYS)"
        warnings.append(f"OPEN SERVICE: listening on {settings.host}:{settings.port} with no API key: anyone who "
                        "reaches this port can embed, search and write the index (set SEMBED_API_KEYS or "
                        f"SEMBED_API_KEYS_FILE to close it, or SEMBED_HOST=127.0.0.1); /admin/ routes are {admin}")
    if settings.index_backend == "local" and settings.index_location() is None:
        warnings.append(f"the index lives in memory only (SEMBED_INDEX_PATH={MEMORY_ONLY}): every collection and "
                        "document is gone when the service stops; unset it to keep them under SEMBED_DATA_DIR "
                        f"({settings.data_dir}/index), or set it to a directory")
    return warnings
