"""The HTTP server: uvicorn, with a header deadline and a shutdown that drains instead of dropping.

On SIGTERM (what Kubernetes and `docker stop` send) readiness fails first, so load balancers stop
routing here; after `drain_delay_s` uvicorn stops accepting, lets in-flight requests finish for up
to `shutdown_grace_s` (the gRPC server, where SEMBED_GRPC_PORT is set, does the same beside it), then the
engines finish their queues and the process exits. A second signal
exits at once.
"""

from __future__ import annotations

import logging
import threading

import uvicorn
from starlette.applications import Starlette
from starlette.datastructures import State

from service.api.protocol import guarded_protocol
from service.settings import Settings

log = logging.getLogger("sembed")


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, drain_delay_s: float, app_state: State):
        super().__init__(config)
        self.drain_delay_s = drain_delay_s
        self.app_state = app_state  # config.app's, typed
        self.draining = False

    def handle_exit(self, sig, frame) -> None:
        if self.draining or self.drain_delay_s <= 0:
            return super().handle_exit(sig, frame)
        self.draining = True
        self.app_state.draining = True  # /readyz answers 503 from now on
        log.info("draining: not ready; stopping in %.1f s", self.drain_delay_s)
        # a timer thread, not the loop: uvicorn only reads the flag it sets, and a signal may arrive anywhere
        timer = threading.Timer(self.drain_delay_s, super().handle_exit, (sig, frame))
        timer.daemon = True
        timer.start()

    async def shutdown(self, sockets=None) -> None:
        grpc = getattr(self.app_state, "grpc", None)
        if grpc is not None:  # TEI's gRPC API stops taking calls and drains those it holds beside HTTP's
            grpc.begin_stop(self.config.timeout_graceful_shutdown or 0)
        await super().shutdown(sockets)


def build_server(app: Starlette, settings: Settings, **config) -> DrainingServer:
    options = {"host": settings.host, "port": settings.port, "log_level": "info", "access_log": False,
               "http": guarded_protocol(settings.header_timeout_s),
               "timeout_graceful_shutdown": settings.shutdown_grace_s, **config}
    return DrainingServer(uvicorn.Config(app, **options), settings.drain_delay_s, app.state)
