"""A 2-node x 2-rank DDP gang (torchrun, gloo, CPU) trains through an AWS notice to node 1.

At the notice the controller launches node 1's replacement at once, in the gang's zone, while every rank of
the gang trains on; once the replacement has booted and run `setup`, node 1 is told to checkpoint, its
request reaches every rank through the process group, and all four stop at one step with the emergency
checkpoint. The next attempt keeps node 0, runs rank 1 on the prepared replacement, and every rank resumes
from that step; the final weights are those of the same run never interrupted.

The next attempt is started ahead on both nodes (a job without accelerators): once the replacement's setup is
done, it and then node 0 start torchrun with the next attempt's rendezvous port, and every rank of it waits in
restore() before node 1 is told to checkpoint; the old attempt stops only then, and the waiting ranks resume.
A start ahead that dies (node 0's, here) leaves the old attempt training until the controller hears of it; the
next attempt then starts anew on every node, on another port, as it did before, with nothing lost.

The local market's clock runs at 4.0 (four times AWS's 120 s): the replacement, and the next attempt's six processes
started ahead beside the four training, get ready long before the deadline even on a busy machine. Its boot is
1 s and its setup a shell builtin, so the test lasts as long as the processes take to start. The first attempt
pauses between steps, so that it is still training when the next attempt is ready (200 steps: 360 s of pauses
at least); a later attempt, and the uninterrupted run, just train: each of a 2 x 2 gang's steps costs CPU that
the processes being started need. The uninterrupted run is tests/e2e/gang_reference.py's, shared with
tests/e2e/test_multinode.py.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from conftest import Controller, Runner, kill_nodes, write_job
from gang_reference import FINAL, TORCHRUN, TRAIN, TRAINING, uninterrupted_gang  # noqa: F401 - a fixture
from output_search import NUMBER_END

BOOT_SECONDS = 1.0
# TRAINING's 200 steps: the first attempt is still training when the next attempt is ready, on a busy machine too.
FIRST_STEP_TIME = 1.8  # the first attempt's pause between steps; a later attempt does not pause
ARGS = f"{TRAINING} --step-time {FIRST_STEP_TIME} --log-every 1"
JOB = f"""
name: gang-train-through
setup: 'true'
run: >-
  {TORCHRUN.format(nodes="$RUNNER_NUM_NODES", rank="$RUNNER_NODE_RANK", addr="$RUNNER_MASTER_ADDR",
                   port="$RUNNER_MASTER_PORT")} train.py {ARGS}
resources: {{cloud: [local], num_nodes: 2}}
checkpoint: {{interval: 1h}}
recovery: {{max_preemptions: 3, max_failures: 0, resume_drill: 'off'}}
"""
# Unanchored: ranks (and the library's log lines) printing at once share a line ("...step=90rank 1/4: resumed").
STEP = re.compile(r"step (\d+) at (\d+\.\d+)")
BUILT = re.compile(r"rank (\d): built at (\d+\.\d+)")
DIE_AHEAD = "die-ahead"  # in the workdir: node 0's process started ahead exits before its restore()


def _trainee() -> str:
    """examples/multinode/train.py, its progress lines stamped with the time (rank 0 prints them)."""
    source = TRAIN.read_text()
    line = 'print(f"step {step} loss {loss.item():.4f}", flush=True)'
    restore = "    step = ckpt.restore()\n"
    parse = "    args = parser.parse_args()\n"
    future = "from __future__ import annotations\n"
    assert line in source and restore in source and parse in source and future in source
    # A process started ahead that is to die does so first thing, before it imports torch (seconds of CPU for
    # nothing): what matters is that it dies before its restore().
    source = source.replace(future, future + (
        'import os, sys\n'
        'if os.environ.get("RUNNER_RESUME_WAIT") == "1" and os.environ.get("RUNNER_NODE_RANK") == "0" \\\n'
        f'        and os.path.exists("{DIE_AHEAD}"):\n'
        '    sys.exit(3)\n'), 1)
    source = source.replace(parse, parse + (
        '    if os.environ.get("RUNNER_ATTEMPT", "1") != "1":\n'
        '        args.step_time = 0\n'))
    source = source.replace(restore, '    print(f"rank {rank}: built at {time.time():.3f}", flush=True)\n' + restore)
    return source.replace(line, 'print(f"step {step} at {time.time():.3f}", flush=True)')


def _unix(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _agent_log(home: Path, node: str) -> list[dict]:
    lines = (home / "nodes" / node / "agent.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def _logged_at(home: Path, node: str, event: str) -> list[float]:
    """When the node's agent logged ``event`` (unix seconds)."""
    return [_unix(e["timestamp"]) for e in _agent_log(home, node) if e.get("event") == event]


def _train_through(tmp_path, files: dict) -> tuple[Path, dict, dict, dict, str, str, str]:
    """The job through node 1's notice: (home, job, first and second restart-log rows, the old attempt's output,
    the new attempt's, the job's)."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(yaml.safe_dump(
        {"clouds": {"local": {"time_scale": 4.0, "boot_seconds": BOOT_SECONDS}}}))
    controller = Controller(home).start()
    runner = Runner(home)
    runner.env.update({"RUNNER_SERVER": controller.url, "RUNNER_TOKEN": controller.token})
    try:
        folder = tmp_path / "job"
        folder.mkdir()
        job_id = runner.json("submit", str(write_job(folder, JOB, {"train.py": _trainee(), **files})))["id"]
        runner.wait_for_output(job_id, r"step 2 at ", timeout=400)  # training (past its first step): the notice may come
        preempted = runner("preempt", job_id, "--node", "1", "--notice", "aws")
        assert preempted.returncode == 0 and "(rank 1)" in preempted.stdout
        job = runner.wait_for(job_id, lambda j: j["state"] in ("SUCCEEDED", "FAILED"), timeout=600, what="the end")
        first, second = runner.restarts(job_id)  # what the CLI prints, read in this process (tests/conftest.py)
        old_output, new_output, logs = runner.output(job_id, 1), runner.output(job_id, 2), runner.output(job_id)
    finally:
        controller.stop()
        kill_nodes(home)
    return home, job, first, second, old_output, new_output, logs


def _stopped_at(first: dict, second: dict, old_output: str, new_output: str, launched: float) -> tuple[int, float]:
    """Every rank stopped at one step, the emergency checkpoint's, and every rank resumed from it; that step and
    the time of the old attempt's last step."""
    steps = [(int(s), float(t)) for s, t in STEP.findall(old_output)]
    after_notice = [s for s, t in steps if t > launched]
    assert after_notice, "no step was trained after the replacement's launch"
    stops = re.findall(r"rank \d: stopping at step (\d+)", old_output)
    assert len(stops) == 4 and len(set(stops)) == 1
    stopped_at = int(stops[0])
    assert first["checkpoint_step"] == stopped_at == second["resumed_from_step"] == max(after_notice)
    assert len(re.findall(rf"rank \d/4: resumed from step {stopped_at}{NUMBER_END}", new_output)) == 4
    return stopped_at, max(t for s, t in steps)


@pytest.mark.timeout(1200)
def test_a_gang_trains_through_a_notice_and_the_prepared_replacement_takes_the_noticed_rank(tmp_path,
                                                                                            uninterrupted_gang):
    home, job, first, second, old_output, new_output, logs = _train_through(tmp_path, {})

    assert job["state"] == "SUCCEEDED" and job["preemptions"] == 1 and job["attempts"] == 2
    standby = first["standby"]
    assert first["end_reason"] == "preempted" and first["notice"]["node_rank"] == 1
    assert standby["reason"] == "notice" and standby["outcome"] == "took over" and standby["rank"] == 1
    assert [(n["rank"], n["end_reason"]) for n in first["nodes"]] == [(0, "kept"), (1, "preempted")]
    # The replacement was launched at the notice, before the checkpoint ended the attempt, and got ready then.
    launched = _unix(standby["launched_at"])
    assert launched < _unix(first["ended_at"]) + 1  # ended_at has whole seconds
    assert standby["ready_at"] is not None and launched <= _unix(standby["ready_at"])
    # The next attempt: node 0 kept, rank 1 on the prepared replacement, in the gang's zone.
    assert [n["node"] for n in second["nodes"]] == [first["nodes"][0]["node"], standby["node"]]
    assert second["nodes"][1]["zone"] == first["zone"] == second["zone"]
    # The whole gang trained on after the notice (rank 0 is on node 0, which no notice reached), every rank
    # stopped at the emergency checkpoint's step and resumed from it, ending with the uninterrupted run's weights.
    stopped_at, last_step_at = _stopped_at(first, second, old_output, new_output, launched)
    assert FINAL.search(logs).group(1) == uninterrupted_gang.sha256()
    # The next attempt was started ahead on both nodes: each of its four ranks had built its model, and each
    # node's ranks all waited in restore(), before the old attempt's last step; those processes resumed.
    built = BUILT.findall(new_output)
    assert sorted(rank for rank, _ in built) == ["0", "1", "2", "3"]
    assert all(float(at) < last_step_at for _, at in built)
    for node in (first["nodes"][0]["node"], standby["node"]):
        waited = _logged_at(home, node, "the process started ahead waits in restore()")
        assert len(waited) == 1 and waited[0] < last_step_at, node
        assert _logged_at(home, node, "the process started ahead is this attempt's"), node
    # Node 0, kept, fetched node 1's share of the stop's checkpoint while node 1 uploaded it, not in its restore.
    fetched = [e for e in _agent_log(home, first["nodes"][0]["node"]) if e.get("event") == "checkpoint prefetch"]
    assert [(e["step"], e["complete"]) for e in fetched] == [(stopped_at, True)]
    # The ledger: the gap, the replacement's boot and setup (before its attempt existed), every rank's restore.
    assert second["gap_seconds"] is not None and second["gap_seconds"] > 0
    boots = [n["boot_seconds"] for n in second["nodes"]]
    assert boots[0] == 0.0 and boots[1] >= BOOT_SECONDS and second["boot_seconds"] == boots[1]
    setups = [n["setup_seconds"] for n in second["nodes"]]
    assert setups[0] == 0.0 and setups[1] is not None and second["setup_seconds"] == setups[1]
    restores = [n["restore_seconds"] for n in second["nodes"]]
    assert all(r is not None and r >= 0 for r in restores) and second["restore_seconds"] == max(restores)
    assert first["lost_seconds"] == 0.0 and job["goodput"]["redone_seconds"] == 0


@pytest.mark.timeout(1200)
def test_a_start_ahead_that_dies_leaves_the_gang_to_start_anew_with_nothing_lost(tmp_path, uninterrupted_gang):
    """Node 0's process started ahead exits before its restore(): the old attempt trains on until the controller
    hears of it, then stops with the emergency checkpoint; the next attempt starts anew on both nodes (the
    replacement's process started ahead is stopped too) and ends with the uninterrupted run's weights."""
    home, job, first, second, old_output, new_output, logs = _train_through(tmp_path, {DIE_AHEAD: "node 0\n"})

    assert job["state"] == "SUCCEEDED" and job["preemptions"] == 1 and job["attempts"] == 2
    standby = first["standby"]
    assert standby["outcome"] == "took over" and standby["rank"] == 1
    assert [n["node"] for n in second["nodes"]] == [first["nodes"][0]["node"], standby["node"]]
    stopped_at, last_step_at = _stopped_at(first, second, old_output, new_output, _unix(standby["launched_at"]))
    assert FINAL.search(logs).group(1) == uninterrupted_gang.sha256()
    assert first["lost_seconds"] == 0.0 and job["goodput"]["redone_seconds"] == 0
    # Node 0 started the next attempt ahead and its process died; every rank of the next attempt was started
    # anew after the old attempt's last step.
    kept = first["nodes"][0]["node"]
    assert _logged_at(home, kept, "the gang's next attempt started ahead on this kept node")
    assert not _logged_at(home, kept, "the process started ahead waits in restore()")
    built = BUILT.findall(new_output)
    assert sorted(rank for rank, _ in built) == ["0", "1", "2", "3"]
    assert all(float(at) > last_step_at for _, at in built)
