"""The handover after a notice: sent once, only when the acknowledged emergency step is known durable."""

from __future__ import annotations

from agents.handover import Handover


def _handover():
    sent: list[dict] = []
    return Handover(sent.append), sent


def test_waits_for_the_durable_commit_of_the_acknowledged_step():
    """Another rank may acknowledge before rank 0 reports the commit: nothing is handed over before it."""
    handover, sent = _handover()
    handover.on_committed({"op": "committed", "step": 40, "durable": True})  # an older periodic checkpoint
    handover.on_durable({"op": "stopping", "step": 57, "durable": True, "reason": "notice"})
    assert sent == []
    handover.on_committed({"op": "committed", "step": 57, "durable": False})  # the local tier only
    assert sent == []
    handover.on_committed({"op": "committed", "step": 57, "durable": True, "emergency": True})
    assert sent == [{"step": 57, "reason": "notice"}]


def test_the_commit_may_come_first_and_it_is_sent_once():
    handover, sent = _handover()
    handover.on_committed({"op": "committed", "step": 12, "durable": True})
    handover.on_durable({"op": "stopping", "step": 12, "durable": True, "reason": "notice"})
    handover.on_durable({"op": "stopping", "step": 12, "durable": True, "reason": "notice"})  # a second rank
    handover.on_committed({"op": "committed", "step": 12, "durable": True})
    assert sent == [{"step": 12, "reason": "notice"}]


def test_periodic_commits_alone_never_hand_over():
    handover, sent = _handover()
    for step in (10, 20, 30):
        handover.on_committed({"op": "committed", "step": step, "durable": True})
    assert sent == []
