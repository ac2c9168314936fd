"""The reload conversation between the API processes and the supervisor, as typed messages.

An API process asks the supervisor (REQ/REP) to stage an export in a new engine process, to switch every API
process to it, or to discard it; the supervisor announces a switch to every API process (PUB/SUB) and counts
their acknowledgements (PUSH/PULL). Each message is a msgspec struct whose tag names it on the wire (vLLM's
`v1/engine` messages are built the same way): a decoder accepts exactly these shapes, so a malformed or unknown
request is a `msgspec.ValidationError`, never a method picked by a string off the wire.
"""

from __future__ import annotations

import msgspec

# --- asked of the supervisor -----------------------------------------------------------------------


class Stage(msgspec.Struct, tag="stage", frozen=True):
    """Start an engine for `export_dir` beside the serving one; answered once it is ready."""

    name: str
    export_dir: str


class Switch(msgspec.Struct, tag="switch", frozen=True):
    """Every API process moves to the staged engine `token`; then the old engine drains and stops."""

    token: int


class Discard(msgspec.Struct, tag="discard", frozen=True):
    """The staged engine `token` will not be served: stop it."""

    token: int


Request = Stage | Switch | Discard

# --- the supervisor's answers ----------------------------------------------------------------------


class Staged(msgspec.Struct, tag="staged", frozen=True):
    token: int
    endpoint: str  # the new engine's socket


class Switched(msgspec.Struct, tag="switched", frozen=True):
    token: int
    unacknowledged: int  # API processes that did not answer within the grace period


class Discarded(msgspec.Struct, tag="discarded", frozen=True):
    token: int


class Failed(msgspec.Struct, tag="failed", frozen=True):
    error: str


Reply = Staged | Switched | Discarded | Failed

# --- announced to every API process, and acknowledged ----------------------------------------------


class Switching(msgspec.Struct, tag="switching", frozen=True):
    """Serve `name` from the engine at `endpoint` (tokenizer from `export_dir`) from now on."""

    token: int
    name: str
    export_dir: str
    endpoint: str


class Acknowledged(msgspec.Struct, tag="acknowledged", frozen=True):
    token: int
    pid: int


encode = msgspec.msgpack.Encoder().encode
decode_request = msgspec.msgpack.Decoder(Request).decode
decode_reply = msgspec.msgpack.Decoder(Reply).decode
decode_switching = msgspec.msgpack.Decoder(Switching).decode
decode_acknowledged = msgspec.msgpack.Decoder(Acknowledged).decode
