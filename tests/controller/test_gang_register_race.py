"""A gang node's registration and its attempt's end at the same moment: the registration counts for the
attempt that runs when it is written, never for one that ended (and was followed by the next) meanwhile."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from runner.controller import gang_agent
from runner.scheduler.attempts import end_attempt
from runner.scheduler.reconciler import Reconciler
from runner.state.gangs import GangStore

from launched_gang import launched_gang
from races import run_together

# How long the registration, once it has read its attempt, waits for the attempt's end and the next attempt's plan.
# With the attempt read inside the registration's write, they cannot come between the two, and the wait runs out.
END_WAIT_S = 3.0


def test_registration_racing_the_attempts_end_does_not_mark_the_next_attempt_running(db_url, monkeypatch):
    """Node 0 completes attempt 1's rendezvous while node 1's failure ends attempt 1 and attempt 2 is planned on
    the same nodes: the job waits for attempt 2's rendezvous (PROVISIONING), and node 0 registered for attempt 1
    only if it did so before the end. (Its registration read attempt 1 before the end and wrote after it: the
    job went RUNNING for an attempt none of whose nodes had registered, and node 0 was sent to attempt 1.)"""
    store, ctx, (first, second) = launched_gang(db_url, nodes_up=True)
    state = SimpleNamespace(store=store)
    assert gang_agent.register(state, second, "10.0.0.2")[0] == 0  # node 1 waits for node 0
    read, ended = threading.Event(), threading.Event()
    reads = GangStore.latest_for_node

    def latest_for_node(self, node_id, tx=None):
        found = reads(self, node_id, tx)
        if threading.current_thread().name == "register_node_0":
            read.set()
            ended.wait(END_WAIT_S)
        return found

    monkeypatch.setattr(GangStore, "latest_for_node", latest_for_node)
    answers: list = []

    def fail_and_plan() -> None:
        try:
            read.wait(60)
            end_attempt(store, "gang-1", 1, "failed", ranks=(1,), exit_code=1, message="rank 1 failed")
            Reconciler(ctx).tick()  # attempt 2 on the same nodes
        finally:
            ended.set()

    run_together(register_node_0=lambda: answers.append(gang_agent.register(state, store.node(first.id), "10.0.0.1")),
                 end_and_plan=fail_and_plan)
    attempts = store.attempts("gang-1")
    assert [a.attempt for a in attempts] == [1, 2]
    assert attempts[1].end_reason == "running" and attempts[1].running_at is None
    assert store.job("gang-1").state == "PROVISIONING"
    (answer,) = answers
    # Node 0's registration came first (it completed attempt 1's rendezvous before its end) or it waits.
    if answer[0] == 1:
        assert attempts[0].running_at is not None
        assert [e for e in store.events("gang-1") if "attempt 1 running" in (e.message or "")]
    else:
        assert answer[0] == 0
