"""A 2-node x 2-rank DDP job (torchrun, gloo, CPU) on the local provider: the resume drill, then node 1 lost.

The drill runs once for the gang: node 0's agent asks for it, every rank stops at one step, the gang
restarts on the same two nodes, and every node checks that its ranks restored that step. Then
`runner preempt JOB --node 1` sends an AWS notice to node 1's metadata server only. The gang trains on while
node 1's replacement is prepared in the same zone; then node 1's agent asks its ranks for the emergency
checkpoint, and the collective Checkpointer stops every rank (node 0's too, through the process group) at one
step. Node 0 is kept; the replacement takes rank 1; all four ranks resume from that checkpoint. The final weights equal those of the same four
ranks' training never interrupted.
"""

from __future__ import annotations

import pytest
import yaml

from conftest import Controller, Runner, kill_nodes, write_job
from gang_reference import FINAL, TORCHRUN, TRAIN, TRAINING, uninterrupted_gang  # noqa: F401 - a fixture
from output_search import NUMBER_END, occurrences

# Still training when the gang stops for the notice: the stop comes before the notice's 24 s deadline (AWS's 120 s
# at the clock of 0.2), and the 150 steps or more left after the preempt (the drill's 5 s and the 20 steps waited
# for leave them) take 37 s at least. The last attempt, after the notice, does not pause: it just finishes (the
# pauses do not change the weights).
ARGS = f"{TRAINING} --step-time 0.25 --log-every 5"
PARSED = "    args = parser.parse_args()\n"
JOB = f"""
name: gang
run: >-
  {TORCHRUN.format(nodes="$RUNNER_NUM_NODES", rank="$RUNNER_NODE_RANK", addr="$RUNNER_MASTER_ADDR",
                   port="$RUNNER_MASTER_PORT")} train.py {ARGS}
resources: {{cloud: [local], num_nodes: 2}}
checkpoint: {{interval: 1h}}
recovery: {{max_preemptions: 3, max_failures: 0, resume_drill: 5s}}
"""
pytestmark = pytest.mark.timeout(900)  # the module's job, run by its first test, takes minutes on a busy machine


@pytest.fixture(scope="module")
def preempted_gang(tmp_path_factory, uninterrupted_gang):  # the reference trains meanwhile: gang_reference.py
    """Runs the scenario once: submit; the drill ends attempt 1 and attempt 2 resumes; 20 steps later
    `runner preempt JOB --node 1`; the job ends. Returns the CLI driver, the job id, the preempt command's
    output and the job's final status. The gang trains through the notice (its replacement prepared, its next
    attempt started ahead) and stops at one step by the deadline (a job that ends during the notice instead:
    tests/e2e/test_job_ends_during_notice.py)."""
    home = tmp_path_factory.mktemp("home")
    (home / "config.yaml").write_text(yaml.safe_dump({"clouds": {"local": {"time_scale": 0.2}}}))
    controller = Controller(home).start()
    runner = Runner(home)
    runner.env.update({"RUNNER_SERVER": controller.url, "RUNNER_TOKEN": controller.token})
    try:
        folder = tmp_path_factory.mktemp("job")
        source = TRAIN.read_text()
        assert PARSED in source
        (folder / "train.py").write_text(source.replace(PARSED, PARSED + (
            '    if os.environ.get("RUNNER_ATTEMPT", "1") not in ("1", "2"):\n'
            '        args.step_time = 0\n')))
        job_id = runner.json("submit", str(write_job(folder, JOB)))["id"]
        runner.wait_for(job_id, lambda j: j["attempts"] == 2, timeout=240, what="the drill's restart")
        drill_step = runner.restarts(job_id)[0]["checkpoint_step"]
        runner.wait_for(job_id, lambda j: any(int(n) >= drill_step + 20 for n in occurrences(
            r"step (\d+) loss", runner.output(job_id, attempt=2))),
            timeout=240, what="20 steps of attempt 2")
        preempted = runner("preempt", job_id, "--node", "1")
        job = runner.wait_for(job_id, lambda j: j["state"] in ("SUCCEEDED", "FAILED"), timeout=300, what="the end")
        yield runner, job_id, preempted, job
    finally:
        controller.stop()
        kill_nodes(home)


def test_the_drill_runs_once_for_the_gang_and_every_rank_restores_its_step(preempted_gang):
    """Attempt 1 ends as the drill, both nodes kept; the drill passed with all four ranks at its step."""
    runner, job_id, _, _ = preempted_gang
    drilled, resumed, _ = runner.restarts(job_id)
    assert drilled["end_reason"] == "drill" and [n["end_reason"] for n in drilled["nodes"]] == ["kept", "kept"]
    assert [n["node"] for n in resumed["nodes"]] == [n["node"] for n in drilled["nodes"]]  # the same nodes
    drill = drilled["drill"]
    assert drill["passed"] is True and drill["resumed_step"] == drill["checkpoint_step"] == drilled["checkpoint_step"]
    assert drill["ranks"] == {str(rank): drill["checkpoint_step"] for rank in range(4)}
    assert resumed["resumed_from_step"] == drill["checkpoint_step"]


def test_a_notice_to_node_1_keeps_node_0_and_replaces_node_1_in_its_zone(preempted_gang):
    """One preemption after the drill: node 1 preempted and replaced in the same zone, node 0 carried on."""
    runner, job_id, preempted, job = preempted_gang
    assert preempted.returncode == 0 and "(rank 1)" in preempted.stdout
    assert job["state"] == "SUCCEEDED" and job["preemptions"] == 1 and job["attempts"] == 3
    _, first, second = runner.restarts(job_id)
    assert first["end_reason"] == "preempted" and first["notice"]["node_rank"] == 1
    assert [(n["rank"], n["end_reason"]) for n in first["nodes"]] == [(0, "kept"), (1, "preempted")]
    assert second["nodes"][0]["node"] == first["nodes"][0]["node"]  # node 0 carried on
    assert second["nodes"][1]["node"] != first["nodes"][1]["node"]  # node 1 was replaced ...
    assert second["nodes"][1]["zone"] == first["nodes"][1]["zone"] == first["zone"]  # ... in the same zone
    assert second["end_reason"] == "succeeded"
    second_h = 1 / 3600  # the row's times are whole seconds; the cost is billed from the exact ones
    standby = _standby_cost(first)  # node 1's replacement, prepared while the gang trained through the notice
    assert 2 * first["price_per_hour"] * (_hours(first) - second_h) <= first["cost_usd"] - standby \
        <= 2 * first["price_per_hour"] * (_hours(first) + second_h)  # both nodes are billed


def test_the_ledger_shows_each_nodes_start_and_the_gap_at_each_restart(preempted_gang):
    """Per node: a fresh node's boot, 0 for a node already up (after the drill, node 0 after the preemption);
    every node's ranks restored; the row shows the slowest node's; each restart has a gap in training."""
    runner, job_id, _, job = preempted_gang
    drilled, resumed, replaced = runner.restarts(job_id)
    boots = [[n["boot_seconds"] for n in row["nodes"]] for row in (drilled, resumed, replaced)]
    assert all(boot > 0 for boot in boots[0]) and boots[1] == [0.0, 0.0]
    assert boots[2][0] == 0.0 and boots[2][1] > 0 and replaced["boot_seconds"] == boots[2][1]
    for row in (resumed, replaced):
        restores = [n["restore_seconds"] for n in row["nodes"]]
        assert all(r is not None and r >= 0 for r in restores) and row["restore_seconds"] == max(restores)
        assert [n["setup_seconds"] for n in row["nodes"]] == [0.0, 0.0]  # the job has no setup
        assert row["gap_seconds"] > 0
    assert drilled["gap_seconds"] is None
    goodput = job["goodput"]
    assert 0 < goodput["ratio"] < 1 and goodput["redone_seconds"] == 0  # every restart resumed at its last step
    assert goodput["paid_seconds"] >= goodput["training_seconds"]


def test_every_rank_stops_at_one_step_and_resumes_from_it(preempted_gang):
    """All four ranks stop at the step of the emergency checkpoint, and all four resume from it."""
    runner, job_id, _, _ = preempted_gang
    _, first, second = runner.restarts(job_id)
    logs = runner.output(job_id, 2) + runner.output(job_id, 3)
    stops = occurrences(r"rank \d: stopping at step (\d+)", logs)  # (ranks share lines)
    assert len(stops) == 4 and len(set(stops)) == 1
    stopped_at = int(stops[0])
    assert first["checkpoint_step"] == stopped_at == second["resumed_from_step"] > first["resumed_from_step"]
    assert len(occurrences(rf"rank \d/4: resumed from step {stopped_at}{NUMBER_END}", logs)) == 4


def test_the_final_weights_equal_an_uninterrupted_run_of_the_same_topology(preempted_gang, uninterrupted_gang):
    """The preempted and resumed gang ends with the weights of the same four ranks' training never interrupted
    (tests/e2e/gang_reference.py)."""
    runner, job_id, _, _ = preempted_gang
    assert FINAL.search(runner.output(job_id)).group(1) == uninterrupted_gang.sha256()


def _standby_cost(row: dict) -> float:
    """What a replacement prepared during the attempt cost it: billed from its launch until it took over."""
    from datetime import datetime

    standby = row.get("standby") or {}
    if not standby.get("launched_at"):
        return 0.0
    start, end = (datetime.fromisoformat(standby[k].replace("Z", "+00:00"))
                  for k in ("launched_at", "took_over_at" if standby.get("took_over_at") else "released_at"))
    return standby["price_per_hour"] * (end - start).total_seconds() / 3600


def _hours(row: dict) -> float:
    from datetime import datetime

    started, ended = (datetime.fromisoformat(row[k].replace("Z", "+00:00")) for k in ("started_at", "ended_at"))
    return (ended - started).total_seconds() / 3600
