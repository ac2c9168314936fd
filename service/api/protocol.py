"""uvicorn's HTTP protocol with a deadline on request headers, telling the request guard when a client hangs up.

uvicorn times out idle keep-alive connections but not a client that starts a request and never
finishes its headers: such connections pile up until the server runs out of them. The body has
its own deadline in the request guard; this one covers everything before the request reaches it.

A client that hangs up before its answer is sent: the protocol learns it first (connection_lost) and calls
the hook the request guard left in the request's scope, which cancels the request. ASGI's own way, a task
per request waiting on `receive()` for http.disconnect, costs a task per request (`python -m benchmarks.micro`
measures it; RESULTS.md, "The server's own CPU").
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

#: scope["state"] key of the request guard's callback for a client that left mid-request
ON_CLIENT_LEFT = "sembed.on_client_left"


def guarded_protocol(header_timeout_s: float) -> type[HttpToolsProtocol]:
    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self._header_timer is None:  # the next request on a kept-alive connection
                self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            cycle = self.cycle
            super().connection_lost(exc)
            if cycle is not None and not cycle.response_complete:
                on_left = cycle.scope.get("state", {}).get(ON_CLIENT_LEFT)
                if on_left is not None:
                    on_left()

        def _arm(self) -> None:
            self._header_timer = self.loop.call_later(header_timeout_s, self._headers_too_slow)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_too_slow(self) -> None:
            self._header_timer = None
            if self.transport is not None and not self.transport.is_closing():
                self.transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                                     b"connection: close\r\ncontent-length: 62\r\n\r\n"
                                     b'{"error":"request headers too slow","error_type":"Validation"}')
                self.transport.close()

    return GuardedHttpToolsProtocol
