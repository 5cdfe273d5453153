"""A 2-node x 2-rank gang trained through an AWS notice to node 1 (tests/e2e/gang_train_through_job.py) whose next
attempt, started ahead, dies on node 0 before its restore()."""

from __future__ import annotations

import pytest

from gang_reference import FINAL, uninterrupted_gang  # noqa: F401 - a fixture
from gang_train_through_job import BUILT, DIE_AHEAD, logged_at, stopped_at, train_through, unix


@pytest.mark.timeout(1200)
def test_a_start_ahead_that_dies_leaves_the_gang_to_start_anew_with_nothing_lost(tmp_path, uninterrupted_gang):
    """Node 0's process started ahead exits before its restore(): the old attempt trains on until the controller
    hears of it, then stops with the emergency checkpoint; the next attempt starts anew on both nodes (the
    replacement's process started ahead is stopped too) and ends with the uninterrupted run's weights."""
    scenario = train_through(tmp_path, {DIE_AHEAD: "node 0\n"})
    home, job, (first, second) = scenario.home, scenario.job, scenario.rows

    assert job["state"] == "SUCCEEDED" and job["preemptions"] == 1 and job["attempts"] == 2
    standby = first["standby"]
    assert standby["outcome"] == "took over" and standby["rank"] == 1
    assert [n["node"] for n in second["nodes"]] == [first["nodes"][0]["node"], standby["node"]]
    _, last_step_at = stopped_at(first, second, scenario.outputs[1], scenario.outputs[2],
                                 unix(standby["launched_at"]))
    assert FINAL.search(scenario.logs).group(1) == uninterrupted_gang.sha256()
    assert first["lost_seconds"] == 0.0 and job["goodput"]["redone_seconds"] == 0
    # Node 0 started the next attempt ahead and its process died; every rank of the next attempt was started
    # anew after the old attempt's last step.
    kept = first["nodes"][0]["node"]
    assert logged_at(home, kept, "the gang's next attempt started ahead on this kept node")
    assert not logged_at(home, kept, "the process started ahead waits in restore()")
    built = BUILT.findall(scenario.outputs[2])
    assert sorted(rank for rank, _ in built) == ["0", "1", "2", "3"]
    assert all(float(at) > last_step_at for _, at in built)
