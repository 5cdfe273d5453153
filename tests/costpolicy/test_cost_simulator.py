"""The simulator on small synthetic traces with answers worked out by hand, and on two shared trace folders.

Synthetic job: 2 h of work, a 4 h deadline, a 6 min restart, spot $1/h, on-demand $3/h, traces of 10 min
ticks. On-demand always costs (2 h + 6 min) x $3 = $6.30.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.costpolicy.simulate import Job, NodeType, simulate
from runner.costpolicy.traces import load_traces

JOB = Job(work_hours=2, deadline_hours=4, restart_minutes=6, spot_price=1.0, on_demand_price=3.0)
TICKS = 24  # 4 h of 10-minute ticks: one start offset
SHARED = Path(__file__).resolve().parents[2] / "data" / "traces"  # the traces the repository ships


def write_traces(folder: Path, **zones: list[int]) -> Path:
    folder.mkdir(exist_ok=True)
    for zone, data in zones.items():
        (folder / f"{zone}.json").write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": data}))
    return folder


def table(folder: Path, job: Job = JOB, starts: int = 1) -> dict[str, dict]:
    return {r.policy: r.to_json() for r in simulate(load_traces(folder), job, starts=starts)}


def test_spot_always_available_costs_the_spot_price_for_every_policy_but_on_demand(tmp_path):
    result = table(write_traces(tmp_path / "t", a=[1] * TICKS))
    assert result["on-demand"]["mean_cost_usd"] == 6.3
    for policy in ("spot", "uniform-progress", "runner"):
        assert result[policy]["mean_cost_usd"] == 2.1, policy  # (2 h + 6 min) x $1
        assert result[policy]["deadline_met_fraction"] == 1.0
    assert result["runner"]["vs_on_demand"] == pytest.approx(2.1 / 6.3, abs=0.001)


def test_spot_never_available_the_runner_policy_pays_on_demand_and_always_spot_misses(tmp_path):
    result = table(write_traces(tmp_path / "t", a=[0] * TICKS, b=[0] * TICKS))
    assert result["runner"] == {"policy": "runner", "mean_cost_usd": 6.3, "vs_on_demand": 1.0,
                                "deadline_met_fraction": 1.0, "runs": 1}
    assert result["spot"]["deadline_met_fraction"] == 0.0  # it waits to the deadline, then finishes on-demand
    assert result["spot"]["mean_cost_usd"] == 6.3
    assert result["uniform-progress"]["deadline_met_fraction"] == 1.0 and result["uniform-progress"]["runs"] == 2


def test_one_gap_costs_one_more_restart(tmp_path):
    """Spot for 1 h (54 min of work after the first restart), 30 min without, then spot again: every spot
    policy waits out the gap, relaunches (another 6 min) and finishes at 2 h 42 min: (2 h + 12 min) x $1."""
    result = table(write_traces(tmp_path / "t", a=[1] * 6 + [0] * 3 + [1] * 15))
    for policy in ("spot", "uniform-progress", "runner"):
        assert result[policy]["mean_cost_usd"] == 2.2, policy
        assert result[policy]["deadline_met_fraction"] == 1.0


def test_spot_that_never_returns_is_waited_for_only_while_the_deadline_allows(tmp_path):
    """Spot for 1 h (54 min of work), then none: the runner policy waits while its slack after the wait
    still covers a launch and its one-tick margin (until 2 h 20 min), launches on-demand at 2 h 30 min and
    finishes the 66 min left at 3 h 42 min: $1 of spot and (6 + 66) min x $3 = $3.60 of on-demand."""
    result = table(write_traces(tmp_path / "t", a=[1] * 6 + [0] * 18))
    assert result["runner"]["mean_cost_usd"] == 4.6 and result["runner"]["deadline_met_fraction"] == 1.0
    assert result["spot"]["deadline_met_fraction"] == 0.0


def test_the_runner_policy_uses_every_zone(tmp_path):
    """Zone a loses spot after 1 h; zone b has it from then on: the job moves there, one restart later."""
    result = table(write_traces(tmp_path / "t", a=[1] * 6 + [0] * 18, b=[0] * 6 + [1] * 18))
    assert result["runner"]["mean_cost_usd"] == 2.2 and result["runner"]["deadline_met_fraction"] == 1.0


@pytest.mark.parametrize("folder, deadline_hours", [
    ("availability-16node-aws-2023-08-27", 36), ("availability-16node-aws-2023-08-27", 48),
    ("preemption-4node-aws-08-03-2023", 36), ("preemption-4node-aws-08-03-2023", 48)])
def test_shared_traces_reproduce_the_documented_table(folder, deadline_hours):
    """A 24 h job from 50 start offsets with the defaults: the rows of docs/cost-policy.md, as printed."""
    rows = table(SHARED / folder, Job(24, deadline_hours), starts=50)
    assert {policy: (row["mean_cost_usd"], row["vs_on_demand"], row["deadline_met_fraction"])
            for policy, row in rows.items()} == DOCUMENTED[folder, deadline_hours]


DOCUMENTED = {  # (mean cost, against on-demand, deadlines met) per policy
    ("availability-16node-aws-2023-08-27", 36): {"on-demand": (73.7, 1.0, 1.0), "spot": (24.52, 0.333, 0.84),
                                                 "uniform-progress": (56.32, 0.764, 1.0),
                                                 "runner": (26.83, 0.364, 1.0)},
    ("availability-16node-aws-2023-08-27", 48): {"on-demand": (73.7, 1.0, 1.0), "spot": (22.72, 0.308, 1.0),
                                                 "uniform-progress": (57.21, 0.776, 1.0),
                                                 "runner": (22.7, 0.308, 1.0)},
    ("preemption-4node-aws-08-03-2023", 36): {"on-demand": (73.7, 1.0, 1.0), "spot": (22.34, 0.303, 1.0),
                                              "uniform-progress": (40.55, 0.55, 1.0),
                                              "runner": (22.33, 0.303, 1.0)},
    ("preemption-4node-aws-08-03-2023", 48): {"on-demand": (73.7, 1.0, 1.0), "spot": (22.29, 0.302, 1.0),
                                              "uniform-progress": (39.91, 0.542, 1.0),
                                              "runner": (22.27, 0.302, 1.0)},
}


def test_on_demand_moves_back_to_spot_when_spot_returns_with_slack_enough(tmp_path):
    """Instant launches: spot for 1 h (1 h of work), then none for 2 h. The runner policy waits while the
    wait leaves its one-tick margin (to 2 h 50 min), runs on-demand for a tick, and when spot returns at 3 h
    with 50 min of work and 60 min left (the margin's 10 min of slack) moves back to it, as the scheduler does
    (return_to_spot): $1 + 10 min x $3 + 50 min x $1 = $2.33, where staying on on-demand would cost $4."""
    instant = Job(work_hours=2, deadline_hours=4, restart_minutes=0, spot_price=1.0, on_demand_price=3.0)
    result = table(write_traces(tmp_path / "t", a=[1] * 6 + [0] * 12 + [1] * 6), instant)
    assert result["runner"]["mean_cost_usd"] == 2.33 and result["runner"]["deadline_met_fraction"] == 1.0


def test_a_gang_holds_spot_only_where_every_node_fits_and_pays_every_node(tmp_path):
    """Zone a has 1 instance up, zone b 2: a gang of 2 runs in zone b only, and pays both nodes."""
    folder = write_traces(tmp_path / "t", a=[1] * TICKS, b=[2] * TICKS)
    result = table(folder.parent / "t", Job(2, 4, 6, 1.0, 3.0, nodes=2))
    assert result["runner"]["mean_cost_usd"] == 4.2 and result["spot"]["mean_cost_usd"] == 4.2  # 2 x 2.1
    assert result["on-demand"]["mean_cost_usd"] == 12.6
    only_a = {p: r for p, r in table(write_traces(tmp_path / "u", a=[1] * TICKS, b=[1] * TICKS),
                                     Job(2, 4, 6, 1.0, 3.0)).items()}
    assert only_a["runner"]["mean_cost_usd"] == 2.1


SLOW_FAST = (NodeType("slow", 1.0, 0.918, 3.06), NodeType("fast", 4.0, 2.754, 9.18))  # 4x the steps for 3x


def test_a_job_with_two_types_lands_on_the_cheaper_step_from_its_first_measured_attempt_on(tmp_path):
    """Its first launch knows no speed and takes the cheaper hour; every launch after it the cheaper step."""
    folder = write_traces(tmp_path / "t", a=[1] * 6 + [0] * 2 + [1] * 16)
    result = table(folder, Job(2, 4, 6, types=SLOW_FAST))
    assert result["runner"]["launches_by_type"] == {"slow": 1, "fast": 1}
    assert result["on-demand"]["launches_by_type"] == {"slow": 0, "fast": 1}  # the cheaper on-demand step


@pytest.mark.parametrize("job, folder", [
    (Job(24, 36, nodes=4), "availability-16node-aws-2023-08-27"),
    (Job(24, 36, types=SLOW_FAST), "availability-16node-aws-2023-08-27"),
    (Job(24, 36, types=SLOW_FAST, nodes=4), "availability-16node-aws-2023-08-27")])
def test_the_documented_goals_on_the_shipped_traces(job, folder):
    """docs/cost-policy.md: a 4-node gang due in 36 h meets every deadline for less than Uniform Progress; with
    two types, runner launches the slow one only for each run's first attempt."""
    rows = {r.policy: r for r in simulate(load_traces(SHARED / folder, nodes=job.nodes), job, starts=50)}
    assert rows["runner"].deadline_met_fraction == 1.0
    assert rows["runner"].mean_cost_usd < rows["uniform-progress"].mean_cost_usd
    if job.types:
        assert rows["runner"].launches_by_type["slow"] == rows["runner"].runs
