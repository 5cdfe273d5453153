"""The job of the tests that train a 2-node x 2-rank DDP gang (torchrun, gloo, CPU) through an AWS notice to node 1
(tests/e2e/test_gang_train_through.py), and what they read of it.

At the notice the controller launches node 1's replacement at once, in the gang's zone, while every rank of the gang
trains on; the next attempt is started ahead on both nodes (a job without accelerators), then node 1 is told to
checkpoint and every rank stops at one step; the next attempt resumes from it on node 0 and the replacement.

The local market's clock runs at 4.0 (four times AWS's 120 s): the replacement, and the next attempt's six processes
started ahead beside the four training, get ready long before the deadline even on a busy machine. Its boot is
1 s and its setup a shell builtin, so a test lasts as long as the processes take to start. The attempts up to the
last notice pause between steps, so that the gang is still training when the next attempt is ready (200 steps: 360 s
of pauses at least); the last attempt, and the uninterrupted run, just train: each of a 2 x 2 gang's steps costs CPU
that the processes being started need. The uninterrupted run is tests/e2e/gang_reference.py's.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import yaml

from conftest import Controller, Runner, kill_nodes, write_job
from gang_reference import TORCHRUN, TRAIN, TRAINING
from output_search import NUMBER_END

BOOT_SECONDS = 1.0
STEP_TIME = 1.8  # the pause between steps of the attempts that train through the notice (and of a drill before it)
# Unanchored: ranks (and the library's log lines) printing at once share a line ("...step=90rank 1/4: resumed").
STEP = re.compile(r"step (\d+) at (\d+\.\d+)")
BUILT = re.compile(r"rank (\d): built at (\d+\.\d+)")


def job(die_ahead: Path, drill: str = "off") -> str:
    """The job file; ``drill``: its recovery.resume_drill; once ``die_ahead`` exists, node 0's processes started
    ahead exit before their restore()."""
    return f"""
name: gang-train-through
setup: 'true'
env: {{DIE_AHEAD: '{die_ahead}'}}
run: >-
  {TORCHRUN.format(nodes="$RUNNER_NUM_NODES", rank="$RUNNER_NODE_RANK", addr="$RUNNER_MASTER_ADDR",
                   port="$RUNNER_MASTER_PORT")} train.py {TRAINING} --step-time {STEP_TIME} --log-every 1
resources: {{cloud: [local], num_nodes: 2}}
checkpoint: {{interval: 1h}}
recovery: {{max_preemptions: 3, max_failures: 0, resume_drill: '{drill}'}}
"""


def trainee(paused_attempts: int) -> str:
    """examples/multinode/train.py, its progress lines stamped with the time (rank 0 prints them); attempts after
    the first ``paused_attempts`` do not pause between steps."""
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
        '        and os.path.exists(os.environ["DIE_AHEAD"]):\n'
        '    sys.exit(3)\n'), 1)
    source = source.replace(parse, parse + (
        f'    if int(os.environ.get("RUNNER_ATTEMPT", "1")) > {paused_attempts}:\n'
        '        args.step_time = 0\n'))
    source = source.replace(restore, '    print(f"rank {rank}: built at {time.time():.3f}", flush=True)\n' + restore)
    return source.replace(line, 'print(f"step {step} at {time.time():.3f}", flush=True)')


def unix(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def agent_log(home: Path, node: str) -> list[dict]:
    lines = (home / "nodes" / node / "agent.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def logged_at(home: Path, node: str, event: str) -> list[float]:
    """When the node's agent logged ``event`` (unix seconds)."""
    return [unix(e["timestamp"]) for e in agent_log(home, node) if e.get("event") == event]


def train_through(folder: Path, notices: int = 1, drill: bool = False) -> SimpleNamespace:
    """The job in ``folder``: with ``drill``, its resume drill first (5 s into the training); then, each time the next
    attempt trains, an AWS notice to node 1, ``notices`` times. The next attempt started ahead at the last notice
    dies on node 0 where there are two. Returns ``home``, ``job`` (its final status), ``rows`` (the restart log),
    ``outputs`` (each attempt's output, by number), ``logs`` (the job's) and ``preempted`` (each preempt command's
    result)."""
    home = folder / "home"
    home.mkdir()
    (home / "config.yaml").write_text(yaml.safe_dump(
        {"clouds": {"local": {"time_scale": 4.0, "boot_seconds": BOOT_SECONDS}}}))
    controller = Controller(home).start()
    runner = Runner(home)
    runner.env.update({"RUNNER_SERVER": controller.url, "RUNNER_TOKEN": controller.token})
    noticed = 2 if drill else 1  # the first attempt that trains through a notice
    die_ahead = folder / "die-ahead"
    preempted = []
    try:
        text = job(die_ahead, "5s" if drill else "off")
        job_id = runner.json("submit", str(write_job(folder / "job", text,
                                                     {"train.py": trainee(noticed + notices - 1)})))["id"]
        for attempt in range(noticed, noticed + notices):
            first_step = 1
            if attempt > 1:
                runner.wait_for(job_id, lambda j: j["attempts"] == attempt, timeout=400, what=f"attempt {attempt}")
                first_step = runner.restarts(job_id)[attempt - 2]["checkpoint_step"] + 1
            if notices > 1 and attempt == noticed + notices - 1:
                die_ahead.touch()
            # Training (past its first step): the notice may come.
            runner.wait_for_output(job_id, rf"step {first_step + 1} at ", timeout=400, attempt=attempt)
            preempted.append(runner("preempt", job_id, "--node", "1", "--notice", "aws"))
            assert preempted[-1].returncode == 0 and "(rank 1)" in preempted[-1].stdout
        final = runner.wait_for(job_id, lambda j: j["state"] in ("SUCCEEDED", "FAILED"), timeout=600, what="the end")
        rows = runner.restarts(job_id)  # what the CLI prints, read in this process (tests/conftest.py)
        outputs = {n: runner.output(job_id, n) for n in range(1, len(rows) + 1)}
        logs = runner.output(job_id)
    finally:
        controller.stop()
        kill_nodes(home)
    return SimpleNamespace(home=home, job=final, rows=rows, outputs=outputs, logs=logs, preempted=preempted)


def stopped_at(first: dict, second: dict, old_output: str, new_output: str, launched: float) -> tuple[int, float]:
    """Every rank stopped at one step, the emergency checkpoint's, and every rank resumed from it; that step and
    the time of the old attempt's last step."""
    steps = [(int(s), float(t)) for s, t in STEP.findall(old_output)]
    after_notice = [s for s, t in steps if t > launched]
    assert after_notice, "no step was trained after the replacement's launch"
    stops = re.findall(r"rank \d: stopping at step (\d+)", old_output)
    assert len(stops) == 4 and len(set(stops)) == 1
    stopped = int(stops[0])
    assert first["checkpoint_step"] == stopped == second["resumed_from_step"] == max(after_notice)
    assert len(re.findall(rf"rank \d/4: resumed from step {stopped}{NUMBER_END}", new_output)) == 4
    return stopped, max(t for s, t in steps)
