"""A 2-node x 2-rank DDP gang (torchrun, gloo, CPU) on the local provider: the resume drill, then an AWS notice to
node 1 trained through, twice (tests/e2e/gang_train_through_job.py). The scenario runs once, for every test here.

The drill runs once for the gang: node 0's agent asks for it, every rank stops at one step, the gang restarts on the
same two nodes, and every node checks that its ranks restored that step. Then `runner preempt JOB --node 1` sends an
AWS notice to node 1's metadata server only. At the notice the controller launches node 1's replacement at once, in
the gang's zone, while every rank of the gang trains on; once the replacement has booted and run `setup`, node 1 is
told to checkpoint, its request reaches every rank through the process group, and all four stop at one step with the
emergency checkpoint. The next attempt keeps node 0, runs rank 1 on the prepared replacement, and every rank resumes
from that step; the final weights are those of the same run never interrupted (tests/e2e/gang_reference.py).

The next attempt is started ahead on both nodes (a job without accelerators): once the replacement's setup is
done, it and then node 0 start torchrun with the next attempt's rendezvous port, and every rank of it waits in
restore() before node 1 is told to checkpoint; the old attempt stops only then, and the waiting ranks resume.
At the second notice (to node 1 again, the first one's replacement), node 0's process started ahead dies before its
restore(): the old attempt trains on until the controller hears of it, then stops with the emergency checkpoint, and
the next attempt starts anew on both nodes, with nothing lost.
"""

from __future__ import annotations

from datetime import datetime

import pytest

from gang_reference import FINAL, uninterrupted_gang  # noqa: F401 - a fixture
from gang_train_through_job import BOOT_SECONDS, BUILT, agent_log, logged_at, stopped_at, train_through, unix
from output_search import NUMBER_END, occurrences

pytestmark = pytest.mark.timeout(1200)  # the module's job, run by its first test, takes minutes on a busy machine


@pytest.fixture(scope="module")
def drilled_gang(tmp_path_factory, uninterrupted_gang):  # the reference trains meanwhile: gang_reference.py
    """The scenario, run once: the drill ends attempt 1, attempt 2 resumes and trains through node 1's notice,
    attempt 3 through the second notice (its start ahead dying on node 0), attempt 4 finishes
    (gang_train_through_job.train_through)."""
    return train_through(tmp_path_factory.mktemp("gang"), notices=2, drill=True)


def test_the_drill_runs_once_for_the_gang_and_every_rank_restores_its_step(drilled_gang):
    """Attempt 1 ends as the drill, both nodes kept; the drill passed with all four ranks at its step."""
    drilled, resumed, *_ = drilled_gang.rows
    assert drilled["end_reason"] == "drill" and [n["end_reason"] for n in drilled["nodes"]] == ["kept", "kept"]
    assert [n["node"] for n in resumed["nodes"]] == [n["node"] for n in drilled["nodes"]]  # the same nodes
    drill = drilled["drill"]
    assert drill["passed"] is True and drill["resumed_step"] == drill["checkpoint_step"] == drilled["checkpoint_step"]
    assert drill["ranks"] == {str(rank): drill["checkpoint_step"] for rank in range(4)}
    assert resumed["resumed_from_step"] == drill["checkpoint_step"]


def test_a_notice_to_node_1_keeps_node_0_and_replaces_node_1_in_its_zone(drilled_gang):
    """Each preemption after the drill: node 1 preempted and replaced in the same zone, node 0 carried on."""
    job = drilled_gang.job
    assert all(p.returncode == 0 and "(rank 1)" in p.stdout for p in drilled_gang.preempted)
    assert job["state"] == "SUCCEEDED" and job["preemptions"] == 2 and job["attempts"] == 4
    _, first, second, third = drilled_gang.rows
    for noticed, after in ((first, second), (second, third)):
        assert noticed["end_reason"] == "preempted" and noticed["notice"]["node_rank"] == 1
        assert [(n["rank"], n["end_reason"]) for n in noticed["nodes"]] == [(0, "kept"), (1, "preempted")]
        assert after["nodes"][0]["node"] == noticed["nodes"][0]["node"]  # node 0 carried on
        assert after["nodes"][1]["node"] != noticed["nodes"][1]["node"]  # node 1 was replaced ...
        assert after["nodes"][1]["zone"] == noticed["nodes"][1]["zone"] == noticed["zone"]  # ... in the same zone
    assert third["end_reason"] == "succeeded"
    second_h = 1 / 3600  # the row's times are whole seconds; the cost is billed from the exact ones
    standby = _standby_cost(first)  # node 1's replacement, prepared while the gang trained through the notice
    assert 2 * first["price_per_hour"] * (_hours(first) - second_h) <= first["cost_usd"] - standby \
        <= 2 * first["price_per_hour"] * (_hours(first) + second_h)  # both nodes are billed


def test_the_ledger_shows_each_nodes_start_and_the_gap_at_each_restart(drilled_gang):
    """Per node: a fresh node's boot, 0 for a node already up (after the drill, node 0 after the preemption);
    every node's ranks restored; the row shows the slowest node's; each restart has a gap in training."""
    job = drilled_gang.job
    drilled, resumed, *replaced = drilled_gang.rows
    boots = [[n["boot_seconds"] for n in row["nodes"]] for row in (drilled, resumed, *replaced)]
    assert all(boot > 0 for boot in boots[0]) and boots[1] == [0.0, 0.0]
    for row, boot in zip(replaced, boots[2:]):
        assert boot[0] == 0.0 and boot[1] > 0 and row["boot_seconds"] == boot[1]
    for row in (resumed, *replaced):
        restores = [n["restore_seconds"] for n in row["nodes"]]
        assert all(r is not None and r >= 0 for r in restores) and row["restore_seconds"] == max(restores)
        assert row["gap_seconds"] > 0
    # A node kept runs no setup again (a job without setup: tests/e2e/test_slow_market.py)
    assert [n["setup_seconds"] for n in resumed["nodes"]] == [0.0, 0.0]
    assert drilled["gap_seconds"] is None
    goodput = job["goodput"]
    assert 0 < goodput["ratio"] < 1 and goodput["redone_seconds"] == 0  # every restart resumed at its last step
    assert goodput["paid_seconds"] >= goodput["training_seconds"]


def test_every_rank_stops_at_one_step_and_resumes_from_it(drilled_gang):
    """All four ranks stop at the step of the emergency checkpoint, and all four resume from it."""
    rows, outputs = drilled_gang.rows, drilled_gang.outputs
    for attempt in (2, 3):  # each attempt that a notice ended, and the next
        first, second = rows[attempt - 1], rows[attempt]
        stops = occurrences(r"rank \d: stopping at step (\d+)", outputs[attempt])  # (ranks share lines)
        assert len(stops) == 4 and len(set(stops)) == 1
        stopped = int(stops[0])
        assert first["checkpoint_step"] == stopped == second["resumed_from_step"] > first["resumed_from_step"]
        resumed = occurrences(rf"rank \d/4: resumed from step {stopped}{NUMBER_END}", outputs[attempt + 1])
        assert len(resumed) == 4


def test_the_final_weights_equal_an_uninterrupted_run_of_the_same_topology(drilled_gang, uninterrupted_gang):
    """The drilled, preempted and resumed gang ends with the weights of the same four ranks' training never
    interrupted."""
    assert FINAL.search(drilled_gang.logs).group(1) == uninterrupted_gang.sha256()


def test_a_gang_trains_through_a_notice_and_the_prepared_replacement_takes_the_noticed_rank(drilled_gang):
    home, job = drilled_gang.home, drilled_gang.job
    drilled, first, second, _ = drilled_gang.rows
    old_output, new_output = drilled_gang.outputs[2], drilled_gang.outputs[3]

    standby = first["standby"]
    assert first["end_reason"] == "preempted" and first["notice"]["node_rank"] == 1
    assert standby["reason"] == "notice" and standby["outcome"] == "took over" and standby["rank"] == 1
    assert [(n["rank"], n["end_reason"]) for n in first["nodes"]] == [(0, "kept"), (1, "preempted")]
    # The replacement was launched at the notice, before the checkpoint ended the attempt, and got ready then.
    launched = unix(standby["launched_at"])
    assert launched < unix(first["ended_at"]) + 1  # ended_at has whole seconds
    assert standby["ready_at"] is not None and launched <= unix(standby["ready_at"])
    # The next attempt: node 0 kept, rank 1 on the prepared replacement, in the gang's zone.
    assert [n["node"] for n in second["nodes"]] == [first["nodes"][0]["node"], standby["node"]]
    assert second["nodes"][1]["zone"] == first["zone"] == second["zone"]
    # The whole gang trained on after the notice (rank 0 is on node 0, which no notice reached), every rank
    # stopped at the emergency checkpoint's step and resumed from it (the final weights: the test above).
    stopped, last_step_at = stopped_at(first, second, old_output, new_output, launched)
    # The next attempt was started ahead on both nodes: each of its four ranks had built its model, and each
    # node's ranks all waited in restore(), before the old attempt's last step; those processes resumed.
    built = BUILT.findall(new_output)
    assert sorted(rank for rank, _ in built) == ["0", "1", "2", "3"]
    assert all(float(at) < last_step_at for _, at in built)
    for node in (first["nodes"][0]["node"], standby["node"]):
        waited = logged_at(home, node, "the process started ahead waits in restore()")
        assert len(waited) == 1 and waited[0] < last_step_at, node
        assert logged_at(home, node, "the process started ahead is this attempt's"), node
    # Node 0, kept, fetched node 1's share of the stop's checkpoint while node 1 uploaded it, not in its restore
    # (as it fetched the drill's before, and the second notice's after).
    fetched = [e for e in agent_log(home, first["nodes"][0]["node"]) if e.get("event") == "checkpoint prefetch"]
    assert [(e["step"], e["complete"]) for e in fetched] == [
        (drilled["checkpoint_step"], True), (stopped, True), (second["checkpoint_step"], True)]
    # The ledger: the gap, the replacement's boot and setup (before its attempt existed), every rank's restore.
    assert second["gap_seconds"] is not None and second["gap_seconds"] > 0
    boots = [n["boot_seconds"] for n in second["nodes"]]
    assert boots[0] == 0.0 and boots[1] >= BOOT_SECONDS and second["boot_seconds"] == boots[1]
    setups = [n["setup_seconds"] for n in second["nodes"]]
    assert setups[0] == 0.0 and setups[1] is not None and second["setup_seconds"] == setups[1]
    restores = [n["restore_seconds"] for n in second["nodes"]]
    assert all(r is not None and r >= 0 for r in restores) and second["restore_seconds"] == max(restores)
    assert first["lost_seconds"] == 0.0 and job["goodput"]["redone_seconds"] == 0



def test_a_start_ahead_that_dies_leaves_the_gang_to_start_anew_with_nothing_lost(drilled_gang, uninterrupted_gang):
    """At the second notice, node 0's process started ahead exits before its restore(): the old attempt trains on
    until the controller hears of it, then stops with the emergency checkpoint; the next attempt starts anew on both
    nodes (the replacement's process started ahead is stopped too) and ends with the uninterrupted run's weights."""
    home, job = drilled_gang.home, drilled_gang.job
    _, _, first, second = drilled_gang.rows
    standby = first["standby"]
    assert standby["outcome"] == "took over" and standby["rank"] == 1
    assert [n["node"] for n in second["nodes"]] == [first["nodes"][0]["node"], standby["node"]]
    _, last_step_at = stopped_at(first, second, drilled_gang.outputs[3], drilled_gang.outputs[4],
                                 unix(standby["launched_at"]))
    assert FINAL.search(drilled_gang.logs).group(1) == uninterrupted_gang.sha256()
    assert first["lost_seconds"] == 0.0 and job["goodput"]["redone_seconds"] == 0
    # Node 0 started the next attempt ahead at each notice; at this one its process died (the one that waited in
    # restore() is the first notice's); every rank of the next attempt was started anew after the old attempt's
    # last step.
    kept = first["nodes"][0]["node"]
    assert len(logged_at(home, kept, "the gang's next attempt started ahead on this kept node")) == 2
    waited = logged_at(home, kept, "the process started ahead waits in restore()")
    assert len(waited) == 1 and waited[0] < unix(first["started_at"]) + 1  # started_at has whole seconds
    built = BUILT.findall(drilled_gang.outputs[4])
    assert sorted(rank for rank, _ in built) == ["0", "1", "2", "3"]
    assert all(float(at) > last_step_at for _, at in built)

def _standby_cost(row: dict) -> float:
    """What a replacement prepared during the attempt cost it: billed from its launch until it took over."""
    standby = row.get("standby") or {}
    if not standby.get("launched_at"):
        return 0.0
    start, end = (datetime.fromisoformat(standby[k].replace("Z", "+00:00"))
                  for k in ("launched_at", "took_over_at" if standby.get("took_over_at") else "released_at"))
    return standby["price_per_hour"] * (end - start).total_seconds() / 3600


def _hours(row: dict) -> float:
    started, ended = (datetime.fromisoformat(row[k].replace("Z", "+00:00")) for k in ("started_at", "ended_at"))
    return (ended - started).total_seconds() / 3600
