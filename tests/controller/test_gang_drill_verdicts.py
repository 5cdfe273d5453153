"""A gang's resume drill: every node reports the verdict for its own ranks, at nearly the same moment; the
drill's record keeps every node's ranks, whatever the order the reports are written in."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from runner.controller import gang_agent
from runner.state import Store
from runner.state.gangs import GangStore

from launched_gang import launched_gang

# How long the first report's write waits for the second report to have read the drill record. With the
# record read inside the write, the second cannot read before the first commits, and the wait runs out.
SECOND_READ_WAIT_S = 3.0


def test_two_nodes_drill_verdicts_written_at_once_keep_both_nodes_ranks(db_url, monkeypatch):
    """Node 0's verdict is being written when node 1's report reads the record: both nodes' ranks end up in it,
    counted as two reports (a merge of what was read before node 0's write dropped node 0's ranks)."""
    store, _, (first, second) = launched_gang(db_url)
    second_read = threading.Event()
    reads, writes = Store.attempts, GangStore.set_drill

    def attempts(self, job_id, tx=None):
        found = reads(self, job_id, tx)
        if threading.current_thread().name == "report-of-node-1":
            second_read.set()
        return found

    def set_drill(self, tx, *args):
        if threading.current_thread().name == "report-of-node-0":
            second_read.wait(SECOND_READ_WAIT_S)
        return writes(self, tx, *args)

    monkeypatch.setattr(Store, "attempts", attempts)
    monkeypatch.setattr(GangStore, "set_drill", set_drill)
    state = SimpleNamespace(store=store)
    verdicts = {first: {"passed": True, "step": 56, "ranks": {"0": 56, "1": 56}},
                second: {"passed": True, "step": 56, "ranks": {"2": 56, "3": 56}}}
    errors: list[BaseException] = []

    def report(node) -> None:
        try:
            gang_agent.record_drill(state, node, verdicts[node])
        except BaseException as exc:  # noqa: BLE001 - the test fails on it below
            errors.append(exc)

    node_0 = threading.Thread(target=report, args=(first,), name="report-of-node-0")
    node_0.start()
    node_1 = threading.Thread(target=report, args=(second,), name="report-of-node-1")
    node_1.start()
    for thread in (node_0, node_1):
        thread.join(60)
    assert not errors, errors
    drill = store.attempts("gang-1")[0].drill
    assert drill["ranks"] == {"0": 56, "1": 56, "2": 56, "3": 56}
    assert drill["nodes_reported"] == 2 and drill["passed"] is True
