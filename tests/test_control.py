"""The supervisor's reload conversation (service/ipc/control.py): typed messages, a handler table, and a request
that is not one of them refused by name, never dispatched. The staged engine itself is covered end to end by
tests/test_processes.py."""

from __future__ import annotations

import threading

import msgpack
import msgspec
import pytest
import zmq

from service.api.topology import Topology
from service.ipc import control
from service.settings import Settings
from service.supervisor import Supervisor


def test_each_message_round_trips_with_its_tag_on_the_wire():
    for message in (control.Stage("main", "/models/v2"), control.Switch(3), control.Discard(3)):
        frame = control.encode(message)
        assert msgpack.unpackb(frame)["type"] == type(message).__name__.lower()
        assert control.decode_request(frame) == message
    for reply in (control.Staged(1, "ipc:///tmp/e.sock"), control.Switched(1, 0), control.Discarded(1),
                  control.Failed("why")):
        assert control.decode_reply(control.encode(reply)) == reply


@pytest.mark.parametrize("wire", [
    {"type": "_retire", "token": 1},  # a private method's name: not a message
    {"op": "switch", "token": 1},  # the old dict shape
    {"type": "switch", "token": "1"},  # a field of the wrong type
    {"type": "stage", "name": "main"},  # a field missing
])
def test_anything_else_is_refused_by_the_decoder(wire):
    with pytest.raises(msgspec.ValidationError):
        control.decode_request(msgpack.packb(wire))


@pytest.fixture
def supervisor_control(tmp_path):
    """A supervisor's control thread on its real sockets, with no engine staged and no API process."""
    supervisor = Supervisor(Settings())
    supervisor.api = []
    topology = Topology([], None, f"ipc://{tmp_path}/control", f"ipc://{tmp_path}/events", f"ipc://{tmp_path}/acks")
    threading.Thread(target=supervisor._control, args=(topology,), daemon=True).start()
    socket = zmq.Context.instance().socket(zmq.REQ)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.RCVTIMEO, 10_000)
    socket.connect(topology.control_endpoint)

    def ask(frame: bytes):
        socket.send(frame)
        return control.decode_reply(socket.recv())

    yield ask
    socket.close()


def test_the_control_thread_answers_through_its_handler_table(supervisor_control):
    assert supervisor_control(control.encode(control.Discard(7))) == control.Discarded(7)
    failed = supervisor_control(control.encode(control.Switch(7)))
    assert isinstance(failed, control.Failed) and "no staged engine 7" in failed.error
    malformed = supervisor_control(msgpack.packb({"type": "_retire", "token": 7}))
    assert isinstance(malformed, control.Failed) and "malformed reload request" in malformed.error
    assert supervisor_control(control.encode(control.Discard(8))) == control.Discarded(8)  # still answering
