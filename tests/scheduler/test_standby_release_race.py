"""A rebalance standby past its timeout, and the notice that makes it the replacement, at the same moment: the
standby is released only if no notice came first, and a notice that came first keeps it."""

from __future__ import annotations

import threading
import time

from races import run_together
from scheduler_world import make_world

from runner.scheduler import standby
from runner.state.standbys import StandbyStore
from runner.state.values import Notice

NOTICE = Notice.from_json({"source": "aws", "kind": "termination", "action": "terminate",
                            "received_at": "2026-11-23T10:00:00Z", "deadline": "2026-11-23T10:02:00Z"})

# How long the release, once it has read the standby's record, waits for the notice to be written. With the record
# read again inside the release's write, a notice written meanwhile is seen there and the standby is kept.
NOTICE_WAIT_S = 3.0


def test_a_notice_written_while_the_rebalance_standby_is_being_released_keeps_it_as_the_replacement(db_url,
                                                                                                  monkeypatch):
    """The release read the record (no notice yet) and the notice came before its write: the standby is the
    replacement the notice was told about, it stays, and its record says so (it was released, with a record
    saying no notice followed, and the node on notice was told to checkpoint with no replacement coming)."""
    world = make_world(db_url)
    job_id = world.submit(recovery={"resume_drill": "off", "max_preemptions": 3,
                                    "prepare_on": ["rebalance", "notice"], "standby_timeout": "10s"})
    world.tick()
    world.register(job_id)
    old = world.node(job_id)
    standby_id = standby.prepare(world.ctx, old, standby.REBALANCE)
    world.tick()
    assert world.store.node(standby_id).state == "running"
    read, noticed = threading.Event(), threading.Event()
    records = StandbyStore.record
    waited = []

    def record(self, tx, job_id, attempt):
        found = records(self, tx, job_id, attempt)
        if threading.current_thread().name == "release" and not waited:
            waited.append(True)
            read.set()
            noticed.wait(NOTICE_WAIT_S)
        return found

    monkeypatch.setattr(StandbyStore, "record", record)

    def notice() -> None:
        try:
            read.wait(60)
            with world.store.db.transaction() as tx:
                world.store.set_attempt_notice(tx, job_id, 1, NOTICE)
            assert standby.prepare(world.ctx, old, standby.NOTICE, deadline=time.time() + 120) == standby_id
        finally:
            noticed.set()

    run_together(release=lambda: standby.release_unneeded(world.ctx, now=time.time() + 11), notice=notice)
    assert world.store.node(standby_id).state == "running"
    record = world.store.current_attempt(job_id).standby
    assert record["notice_at"] is not None and record["outcome"] == "preparing"
    assert standby.old_node_action(world.store, {"job_id": job_id, "attempt": 1}) == "continue"
