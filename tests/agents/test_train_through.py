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


def test_the_expected_checkpoint_time_is_the_slowest_recent_staging_and_upload():
    """One process uploads its emergency checkpoint from the staged buffer: a periodic commit's local write (first,
    then its upload) is not part of it; an emergency commit's own time is."""
    clock = CheckpointClock()
    assert clock.expected() == DEFAULT_CHECKPOINT_SECONDS  # nothing measured: conservative
    # 1 GB on a slow disk: staged in 0.5 s, local commit at 68 s, durable at 73 s: 0.5 s + a 5 s upload
    clock.observe({"op": "committed", "step": 10, "durable": False, "seconds": 68.0})
    clock.observe({"op": "committed", "step": 10, "durable": True, "seconds": 73.0, "staged_seconds": 0.5})
    assert clock.expected() == 5.5
    clock.observe({"op": "committed", "step": 20, "durable": False, "seconds": 2.0})
    clock.observe({"op": "committed", "step": 20, "durable": True, "seconds": 9.0, "staged_seconds": 1.0})
    assert clock.expected() == 8.0 + (8.0 - 5.5)  # the slowest recent one, and how far they spread
    clock.observe({"op": "committed", "step": 25, "durable": True, "emergency": True, "seconds": 12.0,
                   "staged_seconds": 0.5})
    assert clock.expected() == 12.0 + (12.0 - 5.5)
    # A library that does not say its staging time: the whole durable commit, as measured
    old = CheckpointClock()
    old.observe({"op": "committed", "step": 5, "durable": False, "seconds": 1.0})
    old.observe({"op": "committed", "step": 5, "durable": True, "seconds": 4.0})
    assert old.expected() == 4.0


def test_a_timing_checkpoint_saved_the_emergency_way_counts_its_whole_time():
    """A notice's timing checkpoint is uploaded from the staged buffer beside its local write, as the emergency
    one will be: its time to durable is that of the emergency checkpoint, local write and all (on a loaded node
    the two compete); nothing of it is taken off as a periodic commit's local write is."""
    clock = CheckpointClock()
    clock.observe({"op": "committed", "step": 30, "durable": False, "seconds": 4.0, "from_buffer": True})
    clock.observe({"op": "committed", "step": 30, "durable": True, "seconds": 6.8, "staged_seconds": 0.4,
                   "from_buffer": True})
    assert clock.expected() == 6.8


def test_saves_that_vary_widen_the_expected_time_by_their_spread():
    """Two timing checkpoints of one state, 5 s and 8 s apart on a loaded node: the next may well be slower
    still; the emergency checkpoint is given the slowest plus the spread."""
    clock = CheckpointClock()
    for step, seconds in ((10, 5.0), (20, 8.0)):
        clock.observe({"op": "committed", "step": step, "durable": True, "seconds": seconds, "from_buffer": True})
    assert clock.expected() == 11.0
    steady = CheckpointClock()
    for step in (10, 20, 30):
        steady.observe({"op": "committed", "step": step, "durable": True, "seconds": 5.0, "from_buffer": True})
    assert steady.expected() == 5.0


def test_ranks_of_a_process_group_write_locally_first_so_their_clock_counts_the_whole_commit():
    clock = CheckpointClock(from_buffer=False)
    clock.observe({"op": "committed", "step": 10, "durable": True, "seconds": 1.5, "staged_seconds": 0.1})
    clock.observe({"op": "committed", "step": 10, "durable": False, "seconds": 68.0})
    assert clock.expected() == 68.0  # the local commit comes first: a slow disk's is a floor


def test_a_notice_is_trained_through_only_when_its_deadline_leaves_time_beyond_the_checkpoint():
    assert trains_through(_notice(120), expected=2.0)       # AWS's 2 minutes
    assert trains_through(_notice(30, "gcp"), expected=2.0)  # 30 s less (2 s + 3 s) / 0.8 leaves 23.75 s
    # GCP's 30 s with a 10 s checkpoint: the deadline must leave it once (not twice), a margin of max(3 s, 25 %),
    # and the emergency stop's own margin (a fifth of the time left, 0.5 to 10 s): 13.75 s to train
    assert trains_through(_notice(30, "gcp"), expected=10.0)
    assert lead_seconds(30, 10.0) == 13.75 and lead_seconds(120, 40.0) == 60.0  # the stop's margin at most 10 s
    assert not trains_through(_notice(30, "gcp"), expected=20.0)  # a slow checkpoint eats GCP's 30 s

    # What the emergency stop is then given: the answer by the deadline less its margin leaves the checkpoint
    # its expected time and the margin (a 7.6 s checkpoint started 10.9 s before the deadline was given up on)
    from agents.emergency import safety_margin
    from agents.train_through import reserve_seconds
    for expected in (0.1, 2.0, 7.6, 10.0, 40.0, 100.0):
        left = reserve_seconds(expected)
        assert left - safety_margin(left) >= expected + max(3.0, 0.25 * expected) - 1e-9
    assert not trains_through(_notice(6, "gcp"), expected=0.2)
    assert not trains_through(_notice(120, "signal"), expected=0.2)  # SIGTERM: the node is going down now
    assert lead_seconds(None, 1.0) == 0.0


class Recorder:
    def __init__(self):
        self.sent: list[dict] = []
        self.stopped = threading.Event()
        self.start = self.stop_now  # as EmergencyStop.start

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


def test_without_a_word_the_timer_takes_a_durable_checkpoint_and_holds_the_job():
    recorder = Recorder()
    grace = 0.1 + 3.0 + 0.5  # the timer fires half a second in
    TrainThrough(_notice(grace), 0.1, recorder.stop_now, recorder.send).start()
    deadline = time.monotonic() + 30
    while not recorder.sent and time.monotonic() < deadline:
        time.sleep(0.05)
    assert recorder.sent and recorder.sent[0]["op"] == "checkpoint" and recorder.sent[0]["stop"] is False
    assert recorder.sent[0]["hold"] is True and recorder.sent[0]["deadline"] > time.time()
    assert not recorder.stopped.is_set()


def test_the_word_during_the_hold_stops_the_job_and_no_word_by_the_deadline_releases_it():
    ready = Recorder()
    through = TrainThrough(_notice(0.1 + 3.0 + 0.5 + 5), 0.1, ready.stop_now, ready.send).start()
    deadline = time.monotonic() + 30
    while not ready.sent and time.monotonic() < deadline:
        time.sleep(0.05)
    through.checkpoint_now()  # the replacement got ready while the job held at its checkpoint
    assert ready.stopped.wait(10)
    assert [m["op"] for m in ready.sent] == ["checkpoint"]

    false = Recorder()  # nobody says a word and the node outlives the deadline: a false notice
    TrainThrough(_notice(0.1 + 3.0 + 0.5), 0.1, false.stop_now, false.send).start()
    deadline = time.monotonic() + 60
    while len(false.sent) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [m["op"] for m in false.sent] == ["checkpoint", "release"] and not false.stopped.is_set()


def test_a_slower_commit_measured_during_the_notice_starts_the_emergency_checkpoint_sooner():
    """The timer re-reads the expected checkpoint time: a 1 GB state's first durable commit, timed during the
    notice, moves the hold earlier than the guess made at the notice said."""
    recorder = Recorder()
    clock = CheckpointClock()
    clock.observe({"op": "committed", "durable": True, "seconds": 0.1})
    notice = _notice(600.0)
    TrainThrough(notice, clock.expected, recorder.stop_now, recorder.send).start()
    time.sleep(0.2)
    assert recorder.sent == []  # 600 s less 3.1 s: training goes on
    clock.observe({"op": "committed", "durable": True, "seconds": 500.0})  # now 500 s + 25 % leaves none
    deadline = time.monotonic() + 120
    while not recorder.sent and time.monotonic() < deadline:
        time.sleep(0.05)
    assert recorder.sent and recorder.sent[0]["hold"] is True
    assert notice.seconds_left() > 300  # long before the first estimate's moment (3.1 s before the deadline)


class Control:
    def __init__(self):
        self.sent: list[dict] = []

    def send(self, message: dict) -> int:
        self.sent.append(message)
        return 1


class Events:
    """The reporter: notices and commits reach the controller (not here)."""

    def event(self, kind, fields, on_delivered=None):
        pass


def _core():
    from agents.core import AgentCore

    core = AgentCore(config=None, reporter=Events())
    core.may_train_through = True
    core.emergency = Recorder()  # the emergency path: not reached while training goes on
    control = Control()
    core.send_control = control.send
    return core, control


def test_a_notice_before_any_timed_checkpoint_asks_for_one_and_training_goes_on():
    core, control = _core()
    core.on_notice(_notice(120))
    deadline = time.monotonic() + 120
    while not control.sent and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [(m["op"], m["stop"], m.get("hold", False), m.get("timing")) for m in control.sent] == [
        ("checkpoint", False, False, True)]  # saved the emergency way: it times the emergency checkpoint
    assert not core.emergency.stopped.is_set()


def test_the_controllers_word_before_the_timing_checkpoint_leaves_only_the_emergency_one():
    """A job that does not prepare on notices hears "checkpoint" at once: a timing save would hold it up."""
    core, control = _core()
    core.on_notice(_notice(120))
    core.train_through.checkpoint_now()
    assert core.emergency.stopped.wait(60)
    time.sleep(0.1)
    assert control.sent == []


def test_a_notice_after_periodic_commits_still_times_a_checkpoint_saved_the_emergency_way(monkeypatch):
    """One process: a periodic commit (local write first, upload after) does not say what the emergency
    checkpoint (upload beside the local write) costs on the node as loaded now; a timing checkpoint does."""
    import agents.train_through

    monkeypatch.setattr(agents.train_through, "MEASURE_AFTER_SECONDS", 0.0)
    core, control = _core()
    core.checkpoint_clock.observe({"op": "committed", "durable": True, "seconds": 0.5})
    core.on_notice(_notice(120))
    deadline = time.monotonic() + 120
    while not control.sent and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [(m["op"], m["stop"], m.get("timing")) for m in control.sent] == [("checkpoint", False, True)]


def test_a_gang_node_after_a_timed_checkpoint_asks_for_none_until_the_timer(monkeypatch):
    """A gang's ranks write their emergency checkpoint locally first, as a periodic one: a commit timed is the
    measure, and a timing checkpoint would only hold up the gang (asked at once here, were it)."""
    import agents.train_through

    monkeypatch.setattr(agents.train_through, "MEASURE_AFTER_SECONDS", 0.0)
    core, control = _core()
    core._world_size = lambda message: 2
    core.checkpoint_clock.observe({"op": "committed", "durable": True, "seconds": 0.5})
    core.on_notice(_notice(120))
    assert core.train_through is not None and core.train_through.measure is None
    time.sleep(0.2)
    assert control.sent == []


def test_a_gang_nodes_timer_stops_every_rank_with_the_emergency_checkpoint_instead_of_holding():
    """A gang's ranks cannot hold together: at the deadline less the checkpoint's time, the emergency path."""
    recorder = Recorder()
    grace = 0.1 + 3.0 + 0.5  # the timer fires half a second in
    TrainThrough(_notice(grace), 0.1, recorder.stop_now, recorder.send, hold=False).start()
    assert recorder.stopped.wait(10)
    assert recorder.sent == []  # no hold asked for: the emergency path sends its own stop request


def test_the_controllers_word_is_awaited_until_it_comes_or_the_deadline_passes():
    """While awaited, the agent beats more often (the word comes on a heartbeat's reply); not after."""
    recorder = Recorder()
    through = TrainThrough(_notice(600), 0.1, recorder.stop_now, recorder.send).start()
    assert through.awaiting_word
    through.checkpoint_now()
    assert recorder.stopped.wait(60)
    assert not through.awaiting_word

    false = Recorder()  # the deadline passes without a word: a false notice, nothing awaited any more
    late = TrainThrough(_notice(0.1 + 3.0 + 0.5), 0.1, false.stop_now, false.send).start()
    deadline = time.monotonic() + 60
    while late.awaiting_word and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not late.awaiting_word and [m["op"] for m in false.sent] == ["checkpoint", "release"]


class CountingEvents(Events):
    def __init__(self):
        self.kinds: list = []

    def event(self, kind, fields, on_delivered=None):
        self.kinds.append(kind)


def test_another_nodes_commit_is_timed_here_and_reported_by_the_first_ranks_agent_alone():
    """A gang's node on notice times the emergency checkpoint from its own processes' commits (timing only);
    only the job's first rank's agent reports a commit to the controller."""
    from agents.core import AgentCore

    events = CountingEvents()
    core = AgentCore(config=None, reporter=events)
    core.may_train_through = True
    core.emergency = Recorder()
    core.send_control = Control().send
    core._world_size = lambda message: 2  # a gang's node
    core.on_control({"op": "committed", "step": 10, "durable": True, "seconds": 42.0, "timing_only": True})
    assert events.kinds == []
    assert core.checkpoint_clock.expected() >= 42.0
    core.on_notice(_notice(120))
    assert core.train_through is not None and core.train_through.measure is None  # timed: no timing save
