"""Training goes on through a notice while the replacement gets ready.

At a notice whose deadline leaves time, the controller launches the replacement at once; the job trains on
on the old node; the replacement registers, fetches the workdir, runs setup and waits; then the old node
takes its emergency checkpoint and stops, and the replacement resumes from it. A short notice (the
checkpoint's expected time and its margin eat it) is handled as before; a false notice (the node is not
reclaimed) keeps the old node training and releases the replacement; an AWS rebalance recommendation
launches a warm standby where the job asks for one, released when no notice follows in time.

The local market's clock runs at 0.2 unless a test says otherwise: AWS's notice leaves 24 s, GCP's 6 s. Each
test starts two or three nodes that import torch; on a busy machine that alone takes minutes, hence the
timeouts. The trainee pauses between steps in the first attempt only, so that it is still training at the
notice's deadline; a later attempt just finishes. A replacement that must not be ready by the deadline waits
in its setup until the test lets it go, once the old attempt has ended (an event, not a time).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from conftest import REPO, kill_nodes, write_job
from session_reference import FINAL, SessionReference, shared_folder

TRAINEE = """
import hashlib, os, sys, time
print(f"process started at {time.time():.3f}", flush=True)
import torch
from runner.checkpoint import Checkpointer

steps, pause = int(sys.argv[1]), float(sys.argv[2])
build = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0  # a big model takes this long to build, after attempt 1
if os.environ.get("RUNNER_ATTEMPT", "1") != "1":
    pause = 0  # the pause keeps the first attempt training through the notice; a later one just finishes
    time.sleep(build)
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
ckpt = Checkpointer(model=model, optimizer=optimizer, every_steps=10)  # commits measure the checkpoint's time
print(f"restore called at {time.time():.3f}", flush=True)
step = ckpt.restore()
print(f"resumed from step {step}" if step else "starting fresh", flush=True)
while step < steps:
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(step))
    optimizer.zero_grad()
    model(x).pow(2).mean().backward()
    optimizer.step()
    step += 1
    print(f"step {step} at {time.time():.3f}", flush=True)
    ckpt.step(step)
    if ckpt.should_stop:
        print(f"stopping at step {step}", flush=True)
        break
    time.sleep(pause)
ckpt.close()
if step >= steps:
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    print(f"final weights sha256 {digest}", flush=True)
"""


@pytest.fixture
def time_scale() -> float:
    """The local market's clock (a test parametrizes it to change it): AWS's notice leaves 120 s times this."""
    return 0.2


@pytest.fixture
def durable_mb_per_s() -> float | None:
    """The local market's durable bandwidth per node and direction (a test parametrizes it): unlimited."""
    return None


@pytest.fixture
def home(tmp_path: Path, time_scale: float, durable_mb_per_s: float | None) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    local = {"time_scale": time_scale}
    if durable_mb_per_s is not None:
        local["durable_mb_per_s"] = durable_mb_per_s
    (path / "config.yaml").write_text(yaml.safe_dump({"clouds": {"local": local}}))
    yield path
    kill_nodes(path)
STEP = re.compile(r"^step (\d+) at ([0-9.]+)$", re.M)


def _job(name: str, steps: int, setup: str = "echo setting up", recovery: str = "", pause: float = 0.05,
         build: float = 0.0) -> str:
    return (f"name: {name}\nsetup: {setup!r}\nrun: python train.py {steps} {pause} {build}\n"
            "resources: {cloud: [local]}\n"
            f"recovery: {{max_preemptions: 3, max_failures: 0, resume_drill: 'off'{recovery}}}\n")


def _unix(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _submit(tmp_path: Path, runner, text: str) -> str:
    path = write_job(tmp_path / "job", text, {"train.py": TRAINEE})
    return runner.json("submit", str(path))["id"]


def _after_a_durable_commit(runner, job_id: str) -> None:
    """Until the controller has a durable checkpoint of the running attempt: the agent has then timed one too, so a
    short notice is sized on this job's commits (under 0.1 s), not on the default reserved before any is measured."""
    runner.wait_for(job_id, lambda j: ((j["current_attempt"] or {}).get("checkpoint_step") or 0) >= 10,
                    timeout=240, what="a durable checkpoint")


REFERENCE_STEPS = 1000  # the bit-exact tests' job: at most 10 steps a second in the first attempt, 100 s at least


def _start_reference(folder: Path) -> list[subprocess.Popen]:
    """The trainee's REFERENCE_STEPS run start to end outside the runner, without pauses."""
    (folder / "train.py").write_text(TRAINEE)
    return [subprocess.Popen([sys.executable, "train.py", str(REFERENCE_STEPS), "0"], cwd=folder, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                             env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})]


@pytest.fixture(scope="session")
def uninterrupted(tmp_path_factory) -> SessionReference:
    """The reference run's final weights (``sha256()``): started at once, so that it runs while the first test's
    job waits on its notice; once per session for the tests that compare with it (tests/e2e/session_reference.py)."""
    reference = SessionReference(shared_folder(tmp_path_factory), "uninterrupted-train-through", _start_reference)
    reference.start()
    yield reference
    reference.stop()


def _replacement_setup_held(tmp_path: Path) -> tuple[str, Path]:
    """A setup that the first node runs at once and a replacement runs until the test creates the returned file
    (once the first attempt has ended: the replacement cannot be ready by the deadline, however fast the
    machine)."""
    marker, go = tmp_path / "first-setup-done", tmp_path / "replacement-may-finish-setup"
    return f"if [ -e {marker} ]; then while [ ! -e {go} ]; do sleep 0.1; done; else touch {marker}; fi", go


def _release_when_the_first_attempt_ends(runner, job_id: str, go: Path) -> None:
    runner.wait_for(job_id, lambda j: j["preemptions"] == 1, timeout=480, what="the first attempt's end")
    go.touch()


@pytest.mark.timeout(900)
# AWS's full 120 s: the replacement gets ready long before the deadline, even on a busy machine (at 0.2 it may
# not, and the old node then trains on until it is reclaimed: the next test).
@pytest.mark.parametrize("time_scale", [1.0])
def test_an_aws_notice_is_trained_through_and_the_prepared_replacement_resumes_bit_exact(tmp_path, runner,
                                                                                          controller, uninterrupted):
    # The old node must still be training when the replacement is ready, on a busy machine too: 100 s of pauses
    # in the first attempt at least (the second does not pause).
    job_id = _submit(tmp_path, runner, _job("train-through", REFERENCE_STEPS, pause=0.1, build=2.0))
    runner.wait_for_output(job_id, r"^step 30 at ")  # a few commits: the agent knows a checkpoint's time
    assert runner("preempt", job_id, "--notice", "aws").returncode == 0

    job = runner.wait_for(job_id, lambda j: j["state"] in ("SUCCEEDED", "FAILED"), timeout=480, what="the end")
    assert job["state"] == "SUCCEEDED" and job["preemptions"] == 1
    first, second = runner.restarts(job_id)
    standby = first["standby"]
    assert first["end_reason"] == "preempted" and first["notice"]["source"] == "aws"
    assert standby["reason"] == "notice" and standby["outcome"] == "took over"
    # The replacement was launched before the old attempt ended, and it is the node the next attempt ran on.
    assert _unix(standby["launched_at"]) < _unix(first["ended_at"]) + 1  # ended_at has whole seconds
    assert standby["ready_at"] is not None and _unix(standby["launched_at"]) <= _unix(standby["ready_at"])
    assert second["node"] == standby["node"] and second["zone"] != first["zone"]
    # Training went on after the notice, on the old node.
    old_output = runner.output(job_id, 1)
    after_notice = [int(s) for s, t in STEP.findall(old_output) if float(t) > _unix(standby["launched_at"])]
    assert after_notice, "no step was trained on the old node after the replacement's launch"
    stopped_at = int(re.search(r"^stopping at step (\d+)$", old_output, re.M).group(1))
    assert first["checkpoint_step"] == stopped_at == second["resumed_from_step"] == max(after_notice)
    assert first["lost_seconds"] == 0.0
    logs = runner.output(job_id)
    assert f"resumed from step {stopped_at}" in logs
    assert FINAL.search(logs).group(1) == uninterrupted.sha256()
    # The replacement started the job's process once its setup was done, before the handover created its
    # attempt; the process waited in restore() and resumed from the step handed over.
    started = float(re.search(r"^process started at ([0-9.]+)$", runner.output(job_id, 2),
                              re.M).group(1))
    # The restart log's times are whole seconds (a handover that comes within the second the process started
    # in is not later than it): compare at that resolution.
    assert int(started) <= _unix(second["started_at"])
    # Ready once that process waited in restore(): the old node trained on through its imports and the model's
    # 2 s build, instead of pausing for them after the handover.
    waiting = float(re.search(r"^restore called at ([0-9.]+)$", runner.output(job_id, 2), re.M).group(1))
    assert int(waiting) <= _unix(standby["ready_at"])
    # Its setup ran before that attempt existed; the setup's output is in the attempt's log all the same, before
    # the job's own, as the first node's is in the first attempt's.
    for attempt in (1, 2):
        output = runner.output(job_id, attempt)
        assert output.count("setting up") == 1 and output.index("setting up") < output.index("process started at")


@pytest.mark.timeout(900)
# AWS's notice at 0.15: 18 s, waited out to the reclaim. The lead to train on is what the notice leaves less the
# checkpoint's reserve (3.8 s for this job's commits of under 0.1 s: 13.4 s measured), above the 5 s below which the
# node stops at once while a commit takes less than 6 s.
@pytest.mark.parametrize("time_scale", [0.15])
def test_a_replacement_not_ready_by_the_deadline_takes_over_once_the_node_is_reclaimed(tmp_path, runner,
                                                                                      controller, uninterrupted):
    """The replacement's setup outlasts the notice: at the deadline less its checkpoint's time and margin, the old
    node's own timer takes a durable checkpoint and holds the job there until it is reclaimed; the replacement
    then runs the next attempt from that step (nothing redone), with the same final weights."""
    # REFERENCE_STEPS: at most 10 steps a second, still training when reclaimed 18 s after a delayed notice
    setup, go = _replacement_setup_held(tmp_path)
    job_id = _submit(tmp_path, runner, _job("slow-replacement", REFERENCE_STEPS, setup=setup, pause=0.1))
    runner.wait_for_output(job_id, r"^step 30 at ")
    _after_a_durable_commit(runner, job_id)
    assert runner("preempt", job_id, "--notice", "aws").returncode == 0
    _release_when_the_first_attempt_ends(runner, job_id, go)

    job = runner.wait_for(job_id, lambda j: j["state"] in ("SUCCEEDED", "FAILED"), timeout=480, what="the end")
    assert job["state"] == "SUCCEEDED" and job["preemptions"] == 1
    first, second = runner.restarts(job_id)
    assert first["end_reason"] == "preempted" and first["standby"]["outcome"] == "took over"
    assert second["node"] == first["standby"]["node"]
    assert second["resumed_from_step"] == first["checkpoint_step"] > 30
    old_output = runner.output(job_id, 1)
    assert "stopping at step" not in old_output  # never stopped: held until the node went
    assert int(STEP.findall(old_output)[-1][0]) == first["checkpoint_step"]  # no step after the held one
    assert FINAL.search(runner.output(job_id)).group(1) == uninterrupted.sha256()


@pytest.mark.timeout(900)
@pytest.mark.parametrize("time_scale", [0.5])
def test_a_gcp_notice_trains_on_then_holds_at_a_durable_checkpoint_the_replacement_resumes(tmp_path, runner,
                                                                                          controller, uninterrupted):
    """GCP's 30 s at half speed (15 s: more than the checkpoint's time, its 3 s margin and the 5 s lead to train
    on), and a replacement whose setup outlasts it: the old node trains on after the notice until
    the deadline leaves just its checkpoint's time and a margin, commits that step durably and trains no
    further (held, then reclaimed); the replacement resumes from exactly that step, so no step is redone, and
    the final weights are an uninterrupted run's."""
    # REFERENCE_STEPS: 100 s of pauses in the first attempt at least, still training when reclaimed
    setup, go = _replacement_setup_held(tmp_path)
    job_id = _submit(tmp_path, runner, _job("gcp-hold", REFERENCE_STEPS, setup=setup, pause=0.1))
    runner.wait_for_output(job_id, r"^step 30 at ")
    sent = time.time()
    assert runner("preempt", job_id, "--notice", "gcp").returncode == 0
    _release_when_the_first_attempt_ends(runner, job_id, go)

    job = runner.wait_for(job_id, lambda j: j["state"] in ("SUCCEEDED", "FAILED"), timeout=600, what="the end")
    assert job["state"] == "SUCCEEDED" and job["preemptions"] == 1
    first, second = runner.restarts(job_id)
    assert first["end_reason"] == "preempted" and first["standby"]["outcome"] == "took over"
    old_output = runner.output(job_id, 1)
    old_steps = [(int(s), float(t)) for s, t in STEP.findall(old_output)]
    assert [s for s, t in old_steps if t > sent + 1], "no step was trained on the old node after the notice"
    assert "stopping at step" not in old_output  # held, never stopped: the reclaim ended it
    assert old_steps[-1][0] == first["checkpoint_step"] == second["resumed_from_step"]  # nothing redone
    assert FINAL.search(runner.output(job_id)).group(1) == uninterrupted.sha256()


BUSY_TRAINEE = """
import os, sys, threading, time
import torch
from runner.checkpoint import Checkpointer

steps = int(sys.argv[1])
first = os.environ.get("RUNNER_ATTEMPT", "1") == "1"
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
model.register_buffer("ballast", torch.rand(int(float(os.environ["STATE_MB"]) * 1e6 / 4)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
ckpt = Checkpointer(model=model, optimizer=optimizer, every_steps=10)
step = ckpt.restore()
print(f"resumed from step {step}" if step else "starting fresh", flush=True)


def burn():  # a busy node: a thread of the job's own takes a core and the interpreter's lock, to the end
    while True:
        sum(i * i for i in range(10000))


if first:
    threading.Thread(target=burn, daemon=True).start()
while step < steps:
    optimizer.zero_grad()
    model(torch.randn(16, 8)).pow(2).mean().backward()
    optimizer.step()
    step += 1
    print(f"step {step} at {time.time():.3f}", flush=True)
    ckpt.step(step)
    if ckpt.should_stop:
        print(f"stopping at step {step}", flush=True)
        break
    time.sleep(0.1 if first else 0)
ckpt.close()
print("done", flush=True)
"""


@pytest.mark.timeout(900)
@pytest.mark.parametrize("time_scale, durable_mb_per_s", [(1.0, 10.0)])
def test_on_a_busy_node_and_a_slow_durable_tier_the_held_step_is_durable_before_the_deadline(tmp_path, runner,
                                                                                             controller):
    """GCP's 30 s notice, a 40 MB state and a durable tier held to 10 MB/s (4 s an upload), a thread of the job
    burning a core throughout, and a replacement not ready by the deadline: the timing checkpoint, saved the
    emergency way on this busy node, sizes the moment the old node must start its durable checkpoint; that
    checkpoint is durable before the reclaim, so the replacement resumes from the last step trained: nothing
    is redone."""
    setup, go = _replacement_setup_held(tmp_path)
    text = (f"name: busy\nsetup: {setup!r}\nrun: python train.py 100000\nenv: {{STATE_MB: '40'}}\n"
            "resources: {cloud: [local]}\nrecovery: {max_preemptions: 3, max_failures: 0, resume_drill: 'off'}\n")
    path = write_job(tmp_path / "job", text, {"train.py": BUSY_TRAINEE})
    job_id = runner.json("submit", str(path))["id"]
    runner.wait_for_output(job_id, r"^step 30 at ")  # a few periodic commits, each 4 s to the durable tier
    sent = time.time()
    assert runner("preempt", job_id, "--notice", "gcp").returncode == 0
    _release_when_the_first_attempt_ends(runner, job_id, go)

    def resumed(job) -> bool:
        rows = runner.restarts(job_id)
        return len(rows) > 1 and rows[1].get("resumed_from_step") is not None

    runner.wait_for(job_id, resumed, timeout=600, what="the next attempt's restore")
    first, second = runner.restarts(job_id)[:2]
    assert first["end_reason"] == "preempted" and first["standby"]["outcome"] == "took over"
    old_output = runner.output(job_id, 1)
    old_steps = [(int(s), float(t)) for s, t in STEP.findall(old_output)]
    assert [s for s, t in old_steps if t > sent + 1], "no step was trained on the old node after the notice"
    assert "stopping at step" not in old_output  # held at a durable checkpoint until the reclaim
    assert old_steps[-1][0] == first["checkpoint_step"] == second["resumed_from_step"]  # nothing redone
    assert runner("cancel", job_id).returncode == 0


@pytest.mark.timeout(900)
def test_a_short_gcp_notice_checkpoints_at_once_as_before(tmp_path, runner, controller):
    """GCP's 30 s at this clock is 6 s: less than the checkpoint's time plus its 3 s margin and a 5 s lead, so
    the agent stops at once and no replacement is prepared."""
    job_id = _submit(tmp_path, runner, _job("short-notice", 300))
    runner.wait_for_output(job_id, r"^step 30 at ")
    assert runner("preempt", job_id, "--notice", "gcp").returncode == 0
    job = runner.wait_for(job_id, lambda j: j["state"] in ("SUCCEEDED", "FAILED"), timeout=240, what="the end")
    assert job["state"] == "SUCCEEDED"
    first, second = runner.restarts(job_id)
    assert first["end_reason"] == "preempted" and "standby" not in first
    assert first["checkpoint_step"] == second["resumed_from_step"] > 30
    events = runner.json("status", job_id)
    assert events["preemptions"] == 1


@pytest.mark.timeout(900)
# AWS's notice at 0.15 (18 s, as above): the false notice is known only some time after its deadline.
@pytest.mark.parametrize("time_scale", [0.15])
def test_a_false_notice_keeps_the_old_node_training_and_releases_the_replacement(tmp_path, runner, controller):
    """The replacement never gets ready (its setup outlasts the test); the node is not reclaimed at the
    deadline: the old node keeps training and the replacement is released."""
    marker = tmp_path / "first-setup-done"
    setup = f"if [ -e {marker} ]; then sleep 600; else touch {marker}; fi"
    job_id = _submit(tmp_path, runner, _job("false-notice", 100000, setup=setup))
    runner.wait_for_output(job_id, r"^step 30 at ")
    _after_a_durable_commit(runner, job_id)
    assert runner("preempt", job_id, "--notice", "aws", "--no-reclaim").returncode == 0

    def released(job) -> bool:
        standby = (job["current_attempt"] or {}).get("standby") or {}
        return standby.get("outcome") == "released: false notice"

    job = runner.wait_for(job_id, released, timeout=180, what="the replacement's release")
    attempt = job["current_attempt"]
    assert job["state"] == "RUNNING" and job["attempts"] == 1 and job["preemptions"] == 0
    assert attempt["notice"] is None and "false notice" in attempt["message"]
    released_at = _unix(attempt["standby"]["released_at"])
    output = runner.wait_for_output(job_id, rf"^step \d+ at {int(released_at) + 2}")  # still training after
    assert "stopping at step" not in output
    assert runner("cancel", job_id).returncode == 0
    runner.wait_for(job_id, lambda j: j["state"] == "CANCELLED", timeout=60, what="the cancel")


@pytest.mark.timeout(900)
def test_a_rebalance_standby_is_released_when_no_notice_follows(tmp_path, runner, controller):
    job_id = _submit(tmp_path, runner, _job("standby", 100000,
                                            recovery=", prepare_on: [rebalance, notice], standby_timeout: 5s"))
    runner.wait_for_output(job_id, r"^step 10 at ")
    assert runner("preempt", job_id, "--notice", "aws", "--rebalance").returncode == 0

    def released(job) -> bool:
        standby = (job["current_attempt"] or {}).get("standby") or {}
        return standby.get("outcome") == "released"

    job = runner.wait_for(job_id, released, timeout=120, what="the standby's release")
    standby = job["current_attempt"]["standby"]
    assert standby["reason"] == "rebalance"
    assert _unix(standby["released_at"]) - _unix(standby["launched_at"]) >= 5
    assert job["state"] == "RUNNING" and job["attempts"] == 1 and job["preemptions"] == 0
    assert runner("cancel", job_id).returncode == 0
    runner.wait_for(job_id, lambda j: j["state"] == "CANCELLED", timeout=60, what="the cancel")


@pytest.mark.parametrize("value", ["[sometimes]", "notice"])
def test_an_unknown_prepare_on_value_is_refused_naming_the_key(tmp_path, runner, value):
    path = write_job(tmp_path / "job", f"name: bad\nrun: 'true'\nrecovery: {{prepare_on: {value}}}\n")
    result = runner("validate", str(path))
    assert result.returncode == 2 and "prepare_on" in (result.stdout + result.stderr)
