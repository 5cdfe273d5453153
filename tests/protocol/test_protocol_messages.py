"""The control socket's messages and framing, as both ends use them (runner/protocol)."""

from __future__ import annotations

import socket
import threading

import pytest

from runner.protocol import framing, messages
from runner.protocol.messages import (BadMessage, CheckpointRequest, Committed, Hello, Op, Recorded, Restored,
                                      Stopping, Telemetry, UnknownOp, parse)


def test_every_op_has_one_message_class():
    assert set(messages.MESSAGES) == set(Op.values())
    assert set(messages.TO_AGENT) | set(messages.FROM_AGENT) == set(Op)


@pytest.mark.parametrize("message", [
    Hello(pid=42, job_id="j", attempt=2),
    Hello(pid=42, job_id="j", attempt=2, rank=3, local_rank=1, world_size=4),
    Restored(0, None),
    Restored(120, "file:///d/step-00000120/manifest.json", expected=130),
    Committed(120, "/l/step-00000120/manifest.json", True, True, 1.25, 4096),
    Stopping(120, True, "notice", "peer"),
    Telemetry(attempt=2, steps=10, steps_per_second=3.5, final=True),
    CheckpointRequest("drill", True, 1700000000.5),
    Recorded(120),
])
def test_a_message_reads_back_as_itself(message):
    line = framing.encode(message.to_json())
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert parse(framing.decode(line)) == message


def test_the_json_shapes_are_those_of_the_protocol():
    """The wire shapes stay what docs/protocol.md says (optional hello fields and ``expected`` left out when unset)."""
    assert Hello(pid=1).to_json() == {"op": "hello", "pid": 1, "job_id": None, "attempt": None}
    assert Restored(0, None).to_json() == {"op": "restored", "step": 0, "manifest": None}
    assert CheckpointRequest("notice", True, 5.0).to_json() == {"op": "checkpoint", "reason": "notice",
                                                                "deadline": 5.0, "stop": True}
    assert Stopping(3, False, "cancel").to_json() == {"op": "stopping", "step": 3, "durable": False,
                                                      "reason": "cancel", "origin": "self"}


def test_an_unknown_op_is_a_clear_error_not_a_key_error():
    with pytest.raises(UnknownOp, match="unknown control message op 'resize': expected one of hello, restored"):
        parse({"op": "resize"})
    with pytest.raises(UnknownOp, match="op None"):
        parse({"step": 3})


def test_a_missing_or_mistyped_field_is_named():
    with pytest.raises(BadMessage, match="stopping message: field 'step' is None, expected int"):
        parse({"op": "stopping", "durable": True})
    with pytest.raises(BadMessage, match="committed message: field 'durable' is 'yes'"):
        parse({"op": "committed", "step": 3, "durable": "yes"})
    with pytest.raises(BadMessage, match="field 'step' is True"):
        parse({"op": "recorded", "step": True})


def test_unknown_fields_are_passed_over():
    """A newer peer may add fields; the agent adds the sender's rank to what a rank sends."""
    assert parse({"op": "stopping", "step": 3, "durable": True, "rank": 1, "new": "x"}) == Stopping(3, True)


def test_the_library_reads_a_checkpoint_request_leniently():
    """A missing reason is a notice, a deadline that is not a number none (as the library always read it)."""
    assert parse({"op": "checkpoint"}) == CheckpointRequest("notice", False, None)
    assert parse({"op": "checkpoint", "reason": "move", "deadline": True, "stop": 1}) == \
        CheckpointRequest("move", True, None)


def test_the_stronger_of_two_requests_wins():
    timer = CheckpointRequest("notice", False, 100.0)
    stop = CheckpointRequest("cancel", True, 200.0)
    assert timer.merge(stop) == stop.merge(timer) == CheckpointRequest("cancel", True, 100.0)


def test_messages_split_across_reads_arrive_whole_and_in_order():
    """The one reader both ends use: lines cut anywhere by the transport, blank lines, and lines that are not
    messages (passed to on_invalid) between them."""
    ours, theirs = socket.socketpair()
    received, invalid = [], []
    reader = threading.Thread(target=framing.read_messages, args=(ours, received.append, invalid.append))
    reader.start()
    data = (framing.encode(Hello(pid=7).to_json()) + b"\n" + b"not json\n" + b'{"no": "op"}\n'
            + framing.encode(Committed(5, "m", True).to_json()) + framing.encode(Recorded(5).to_json()))
    for i in range(0, len(data), 7):
        theirs.sendall(data[i:i + 7])
    theirs.close()
    reader.join(60)
    assert not reader.is_alive()
    ours.close()
    assert [parse(m) for m in received] == [Hello(pid=7), Committed(5, "m", True), Recorded(5)]
    assert invalid == [b"not json", b'{"no": "op"}']
