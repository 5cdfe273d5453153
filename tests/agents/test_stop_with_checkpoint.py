"""The agent's one stop with a checkpoint (agents/stop_with_checkpoint.py), with the plans its callers choose: the
request on the wire, the wait for ``stopping``, and how the process is made to end. A fake trainee stands for the
process; the real process is in tests/agents/test_move_stop.py and the end-to-end tests."""

from __future__ import annotations

import threading

from agents.cancel import SIGTERM_GRACE_SECONDS, cancel_plan
from agents.drill import drill_plan
from agents.emergency import notice_plan
from agents.stop_with_checkpoint import StopPlan, StopWithCheckpoint
from runner.protocol.messages import CheckpointRequest, parse


class Trainee:
    def __init__(self, done: bool = False):
        self.alive = threading.Event()
        self.alive.set()
        self.unreached = 0
        self.finished: tuple[float, float] | None = None
        self.done = threading.Event()  # every training process closed after its last step
        if done:
            self.done.set()

    def done_training(self) -> bool:
        return self.done.is_set()

    def running(self) -> bool:
        return self.alive.is_set()

    def unreachable(self) -> None:
        self.unreached += 1

    def finish(self, own_exit: float, after_sigterm: float) -> None:
        self.finished = (own_exit, after_sigterm)


class Channel:
    """The control channel: records what was sent; ``answer`` is what the library says back, if anything."""

    def __init__(self, connected: int = 1, answer=None):
        self.connected = connected
        self.answer = answer
        self.sent: list[dict] = []
        self.stop: StopWithCheckpoint | None = None

    def send(self, message: dict) -> int:
        self.sent.append(message)
        if self.answer is not None:
            threading.Thread(target=self.stop.on_ack, args=(self.answer,)).start()
        return self.connected


def run(plan: StopPlan, channel: Channel, trainee: Trainee, **kwargs) -> StopWithCheckpoint:
    stop = StopWithCheckpoint(channel.send, trainee, **kwargs)
    channel.stop = stop
    stop.run(plan)
    return stop


def test_a_cancel_asks_for_a_checkpoint_and_lets_the_process_exit_by_itself_once_answered():
    channel, trainee = Channel(answer={"op": "stopping", "step": 12, "durable": True, "reason": "cancel"}), Trainee()
    stop = run(cancel_plan("cancel", grace=60.0), channel, trainee)
    request = parse(channel.sent[0])
    assert isinstance(request, CheckpointRequest) and request.reason == "cancel" and request.stop
    assert request.deadline is not None
    assert stop.ack["step"] == 12 and stop.durable
    own_exit, after_sigterm = trainee.finished
    assert 50.0 < own_exit <= 60.0 - SIGTERM_GRACE_SECONDS and after_sigterm >= SIGTERM_GRACE_SECONDS


def test_a_move_to_spot_is_the_same_stop_with_the_reason_move():
    channel, trainee = Channel(answer={"op": "stopping", "step": 3, "durable": True}), Trainee()
    run(cancel_plan("move", grace=60.0), channel, trainee)
    assert channel.sent[0]["reason"] == "move"


def test_a_cancel_nobody_hears_stops_the_process_group_at_once():
    channel, trainee = Channel(connected=0), Trainee()
    stop = run(cancel_plan("shutdown", grace=30.0), channel, trainee)
    assert stop.ack is None and trainee.unreached == 0
    assert trainee.finished[0] == 0.0 and trainee.finished[1] > 25.0  # SIGTERM now, the whole grace to SIGKILL


def test_a_notice_nobody_hears_signals_the_process_and_waits_for_it():
    """The library takes a SIGTERM as a notice: the agent waits for the process (here: it exits)."""
    channel, trainee = Channel(connected=0), Trainee()
    threading.Timer(0.2, trainee.alive.clear).start()
    stop = run(notice_plan(60.0), channel, trainee)
    assert trainee.unreached == 1 and stop.ack is None
    assert stop.summary("preempted") == ("preempted: the job did not acknowledge the emergency checkpoint before "
                                         "the deadline")


def test_an_answered_notice_says_which_step_is_durable_and_hands_it_on():
    acknowledged = []
    channel, trainee = Channel(answer={"op": "stopping", "step": 40, "durable": True}), Trainee()
    stop = run(notice_plan(60.0), channel, trainee, on_acknowledged=acknowledged.append)
    assert acknowledged == [{"op": "stopping", "step": 40, "durable": True}]
    assert stop.summary("preempted") == "preempted: emergency checkpoint at step 40, durable"
    assert trainee.finished == (8.0, 2.0)  # up to 10 s in all to exit by itself, the last 2 after SIGTERM


def test_a_notice_after_the_training_ended_asks_nothing_signals_nothing_and_lets_the_process_exit():
    """The job's last step came during the notice: every rank closed after it, and the launcher still runs (its exit
    barrier, a rank's teardown). The notice's stop sends no request, signals no rank, and waits for the exit."""
    channel, trainee = Channel(connected=0), Trainee(done=True)
    threading.Timer(0.3, trainee.alive.clear).start()
    stop = run(notice_plan(60.0), channel, trainee)
    assert channel.sent == [] and trainee.unreached == 0 and stop.ack is None
    assert stop.training_was_over and stop.answer_seconds >= 0.25  # it waited for the process to exit by itself


def test_ranks_that_close_after_their_last_step_as_the_notices_request_arrives_are_left_to_exit():
    """The handover's race: the request reaches ranks in their last step; they close without stopping (nothing to
    answer), and the process exits 0 by itself: no rank is signalled, and the stop says the training was over."""
    channel, trainee = Channel(connected=2), Trainee()
    threading.Timer(0.2, trainee.done.set).start()
    threading.Timer(0.4, trainee.alive.clear).start()
    stop = run(notice_plan(60.0), channel, trainee)
    assert len(channel.sent) == 1 and trainee.unreached == 0 and stop.ack is None
    assert stop.training_was_over


def test_a_training_over_whose_process_outlives_the_deadline_is_ended_then():
    channel, trainee = Channel(connected=0), Trainee(done=True)
    stop = run(notice_plan(1.0), channel, trainee)  # the process never exits by itself
    assert channel.sent == [] and trainee.unreached == 0
    assert stop.training_was_over and trainee.finished is not None  # ended at the deadline's margin


def test_a_cancel_of_a_training_that_is_over_still_stops_its_process():
    """Only a notice's stop spares a finished training (the node goes anyway); a cancel ends what runs at once."""
    channel, trainee = Channel(connected=0), Trainee(done=True)
    stop = run(cancel_plan("cancel", grace=30.0), channel, trainee)
    assert len(channel.sent) == 1 and not stop.training_was_over and trainee.finished[0] == 0.0


def test_a_drill_gives_an_answered_process_ten_seconds_and_measures_the_checkpoint():
    channel, trainee = Channel(answer={"op": "stopping", "step": 5, "durable": True}), Trainee()
    stop = run(drill_plan(120.0), channel, trainee)
    assert channel.sent[0]["reason"] == "drill"
    assert trainee.finished == (8.0, 2.0) and 0 <= stop.answer_seconds < 120.0


def test_a_stop_without_a_checkpoint_sends_nothing():
    """A gang whose attempt ended on another node: its ranks stopped at the gang's checkpoint already."""
    channel, trainee = Channel(), Trainee()
    run(StopPlan(None, 10.0, exit_times=lambda acked, left: (0.0, 10.0)), channel, trainee)
    assert channel.sent == [] and trainee.finished == (0.0, 10.0)


def test_the_agent_routes_each_stopping_to_the_stops_it_answers(tmp_path):
    """One table routes the library's messages; a ``stopping`` goes to the stop under way: the controller's stop
    and the emergency; a peer's stop answers no request of this node's, and is recorded for the exit report."""
    from agents.config import AgentConfig
    from agents.emergency import EmergencyStop
    from agents.main import Agent

    agent = Agent(AgentConfig(scratch_dir=tmp_path / "scratch", node_id="n-route"))
    agent.emergency = EmergencyStop(send=lambda message: 0, trainee=Trainee())
    agent.on_control({"op": "hello", "pid": 4242, "rank": 0})
    assert agent.training_pid == 4242 and agent.stop_progress.laggards() == "rank 0 never answered the stop request"
    agent.on_control({"op": "stopping", "step": 7, "durable": True, "origin": "peer", "rank": 0})
    assert agent.emergency.ack is None and agent.gang.exit_reason("succeeded") == "stopped-by-peer"

    agent.cancel_stop = StopWithCheckpoint(lambda message: 1, Trainee())
    agent.on_control({"op": "stopping", "step": 8, "durable": True, "origin": "self", "rank": 0})
    assert agent.cancel_stop.ack["step"] == agent.emergency.ack["step"] == 8
    assert agent.stop_progress.laggards() is None  # the rank that said hello has stopped


def test_the_agent_reports_a_job_that_ended_during_its_notice_as_succeeded(tmp_path):
    """The notice's stop began after every local rank had closed after its last step: the job's exit 0 is its success,
    not a preemption; a rank that stopped for the request makes it one."""
    from agents.config import AgentConfig
    from agents.emergency import EmergencyStop
    from agents.main import Agent

    agent = Agent(AgentConfig(scratch_dir=tmp_path / "scratch", node_id="n-ended"))
    agent.emergency = EmergencyStop(send=lambda message: 0, trainee=Trainee())
    for rank in (0, 1):
        agent.on_control({"op": "hello", "pid": 100 + rank, "rank": rank})
        agent.on_control({"op": "closed", "step": 400, "error": False, "rank": rank})
    assert agent._training_over_at_the_stop(0) == ""
    assert agent._training_over_at_the_stop(1) is None  # it exited by itself, failing: not a success
    agent.emergency.stop.training_was_over = True  # the stop ended what still ran at the deadline's margin
    assert "was ended (its exit code -15)" in agent._training_over_at_the_stop(-15)
    agent.on_control({"op": "stopping", "step": 400, "durable": True, "origin": "self", "rank": 0})
    assert agent._training_over_at_the_stop(0) is None


def test_a_child_process_whose_training_is_over_is_never_signalled(monkeypatch):
    import os

    from agents.emergency import ChildProcess

    signals = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: signals.append((pid, sig)))
    ChildProcess(lambda: None, lambda: 4242, done_training=lambda: True).unreachable()
    assert signals == []
    ChildProcess(lambda: None, lambda: 4242, done_training=lambda: False).unreachable()
    assert [pid for pid, _ in signals] == [4242]
