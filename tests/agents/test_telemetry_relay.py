"""The agent folds its training processes' telemetry into one report per node."""

from __future__ import annotations

from agents.telemetry import TelemetryRelay


def report(**fields) -> dict:
    return {"op": "telemetry", "attempt": 1, "steps": 10, "steps_per_second": 5.0, "nan_steps": 0,
            "peak_memory_bytes": 100, "memory": "gpu", "final": False, **fields}


def test_a_single_process_is_relayed_as_it_reports():
    """Without ranks every report is forwarded with its own figures."""
    relay = TelemetryRelay()
    assert relay.update(report(pid=7)) == {"steps": 10, "steps_per_second": 5.0, "nan_steps": 0,
                                           "peak_memory_bytes": 100, "memory": "gpu"}


def test_under_torchrun_rank_zero_gives_the_steps_and_the_node_the_largest_peak():
    """Local rank 1's report waits for local rank 0's, which carries rank 0's steps and the ranks' largest peak."""
    relay = TelemetryRelay()
    assert relay.update(report(pid=2, rank=1, local_rank=1, steps=99, peak_memory_bytes=900)) is None
    forwarded = relay.update(report(pid=1, rank=0, local_rank=0, steps=10, nan_steps=None, peak_memory_bytes=300))
    assert forwarded["steps"] == 10 and forwarded["nan_steps"] is None and forwarded["peak_memory_bytes"] == 900


def test_a_node_without_rank_zero_reports_only_its_peak():
    """On node 1 of a gang (global ranks 2 and 3) the relay forwards peak memory, never steps."""
    relay = TelemetryRelay()
    forwarded = relay.update(report(pid=5, rank=2, local_rank=0, peak_memory_bytes=400))
    assert forwarded == {"peak_memory_bytes": 400, "memory": "gpu"}


def test_a_final_report_of_any_rank_is_forwarded():
    """A rank's last report (at close) is forwarded even from a local rank other than 0."""
    relay = TelemetryRelay()
    relay.update(report(pid=1, rank=0, local_rank=0))
    assert relay.update(report(pid=2, rank=1, local_rank=1, final=True, peak_memory_bytes=5000))[
        "peak_memory_bytes"] == 5000


def test_a_new_attempt_starts_from_nothing():
    """The processes of the next attempt (after a drill, on the same agent) do not inherit the last one's peak."""
    relay = TelemetryRelay()
    relay.update(report(pid=1, peak_memory_bytes=8000))
    assert relay.update(report(pid=9, attempt=2, peak_memory_bytes=10))["peak_memory_bytes"] == 10


def test_rank_zeros_step_times_and_the_nodes_slowest_restore_are_forwarded():
    """The ledger's fields: the first and last step (with their times) of rank 0, the slowest local restore."""
    relay = TelemetryRelay()
    timing = {"first_step": 41, "first_step_at": 100.0, "last_step": 90, "last_step_at": 125.0}
    assert relay.update(report(pid=2, rank=1, local_rank=1, restore_seconds=3.5, first_step=7,
                               first_step_at=1.0, last_step=7, last_step_at=1.0)) is None
    forwarded = relay.update(report(pid=1, rank=0, local_rank=0, restore_seconds=1.25, **timing))
    assert {key: forwarded[key] for key in timing} == timing and forwarded["restore_seconds"] == 3.5


def test_a_node_without_rank_zero_forwards_its_restore_but_no_step_times():
    relay = TelemetryRelay()
    forwarded = relay.update(report(pid=5, rank=2, local_rank=0, restore_seconds=0.5, first_step=1,
                                    first_step_at=1.0, last_step=2, last_step_at=2.0))
    assert forwarded == {"peak_memory_bytes": 100, "memory": "gpu", "restore_seconds": 0.5}
