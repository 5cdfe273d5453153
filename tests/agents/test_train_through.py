"""The agent's side of training through a notice (agents/train_through.py): when it trains on, and what it
does on the controller's word and on its own timer."""

from __future__ import annotations

import threading
import time

from agents.train_through import (DEFAULT_CHECKPOINT_SECONDS, CheckpointClock, TrainThrough, lead_seconds,
                                  trains_through)
from agents.watchers import Notice


def _notice(grace: float, source: str = "aws") -> Notice:
    return Notice.create(source, "termination", "terminate", terminal=True, grace=grace)


def test_the_expected_checkpoint_time_is_the_slowest_recent_durable_commit():
    clock = CheckpointClock()
    assert clock.expected() == DEFAULT_CHECKPOINT_SECONDS  # nothing measured: conservative
    clock.observe({"op": "committed", "durable": False, "seconds": 50.0})  # the local tier does not count
    clock.observe({"op": "committed", "durable": True, "seconds": 0.4})
    clock.observe({"op": "committed", "durable": True, "seconds": 1.5})
    assert clock.expected() == 1.5


def test_a_notice_is_trained_through_only_when_its_deadline_leaves_time_beyond_the_checkpoint():
    assert trains_through(_notice(120), expected=2.0)       # AWS's 2 minutes
    assert trains_through(_notice(30, "gcp"), expected=2.0)  # 30 s less 2 x 2 s + 5 s leaves 21 s
    assert not trains_through(_notice(30, "gcp"), expected=10.0)  # a slow checkpoint eats GCP's 30 s
    assert not trains_through(_notice(6, "gcp"), expected=0.2)
    assert not trains_through(_notice(120, "signal"), expected=0.2)  # SIGTERM: the node is going down now
    assert lead_seconds(None, 1.0) == 0.0


class Recorder:
    def __init__(self):
        self.sent: list[dict] = []
        self.stopped = threading.Event()

    def send(self, message: dict) -> int:
        self.sent.append(message)
        return 1

    def stop_now(self, notice) -> None:
        self.stopped.set()


def test_the_controllers_word_stops_the_job_at_once():
    recorder = Recorder()
    through = TrainThrough(_notice(120), 0.1, recorder.stop_now, recorder.send).start()
    through.checkpoint_now()
    assert recorder.stopped.wait(10)
    assert recorder.sent == []  # the emergency path sends its own stop request


def test_without_a_word_the_timer_takes_a_durable_checkpoint_and_training_goes_on():
    recorder = Recorder()
    grace = 2 * 0.1 + 5.0 + 0.5  # the timer fires half a second in
    TrainThrough(_notice(grace), 0.1, recorder.stop_now, recorder.send).start()
    deadline = time.monotonic() + 30
    while not recorder.sent and time.monotonic() < deadline:
        time.sleep(0.05)
    assert recorder.sent and recorder.sent[0]["op"] == "checkpoint" and recorder.sent[0]["stop"] is False
    assert recorder.sent[0]["deadline"] > time.time()
    assert not recorder.stopped.is_set()
