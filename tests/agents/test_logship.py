"""The log shipper against a controller that stores what it acknowledges, or loses some of it."""

from __future__ import annotations

import base64

from agents.logship import LogShipper
from runner.client import ControllerUnreachable


class Controller:
    """The log endpoints' contract: append at an offset, refuse a gap by answering the stored size."""

    def __init__(self):
        self.stored = b""
        self.down = False

    def post(self, path: str, body: dict) -> dict:
        if self.down:
            raise ControllerUnreachable("down")
        offset, data = body["offset"], base64.b64decode(body["data_b64"])
        if offset <= len(self.stored):
            self.stored = self.stored[:offset] + data if offset + len(data) > len(self.stored) else self.stored
        return {"offset": len(self.stored)}

    def get(self, path: str) -> dict:
        if self.down:
            raise ControllerUnreachable("down")
        return {"offset": len(self.stored)}


def test_output_the_controller_lost_after_acknowledging_it_is_sent_again_from_the_nodes_copy(tmp_path):
    controller = Controller()
    with open(tmp_path / "job.log", "ab") as copy:
        copy.write(b"an earlier attempt's output\n")
        shipper = LogShipper(controller, 0, local_copy=copy)
        shipper.write(b"line 1\nline 2\n")
        assert shipper.flush(5)
        controller.stored = controller.stored[:7]  # a failover lost the newest commit it had acknowledged
        controller.down = True
        shipper.write(b"line 3\n")
        assert not shipper.flush(0.1)  # unreachable: kept, and it asks where the controller stands next time
        controller.down = False
        shipper.write(b"line 4\n")
        assert shipper.flush(5)
    assert controller.stored == b"line 1\nline 2\nline 3\nline 4\n"


def test_a_gap_refused_without_a_failure_is_filled_from_the_nodes_copy(tmp_path):
    controller = Controller()
    with open(tmp_path / "job.log", "ab") as copy:
        shipper = LogShipper(controller, 0, local_copy=copy)
        shipper.write(b"line 1\nline 2\n")
        assert shipper.flush(5)
        controller.stored = b""
        shipper.write(b"line 3\n")
        assert shipper.flush(5)
    assert controller.stored == b"line 1\nline 2\nline 3\n"
