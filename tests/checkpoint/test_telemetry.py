"""Job telemetry on the training side: NaN steps without a device sync, batched reports, steps/s, the manifest."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import subprocess
import sys
import time

import pytest
import torch

from runner.checkpoint.run_manifest import run_manifest
from runner.checkpoint.telemetry import NonFiniteCounter, StepTelemetry, peak_memory
from runner.source import SOURCE_FILE, git_state, source_record

from .test_control import agent  # noqa: F401 - the fake agent on the control socket

NAN, INF = float("nan"), float("inf")


class Sent:
    """A control client that keeps what it is sent."""

    def __init__(self) -> None:
        self.messages: list[dict] = []

    def send(self, message: dict) -> None:
        self.messages.append(message)

    def ops(self, op: str) -> list[dict]:
        return [m for m in self.messages if m["op"] == op]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_nan_steps_count_nan_and_inf_losses_exactly():
    """Floats and tensors, NaN, +inf and -inf each count one step; finite losses count none."""
    losses = [1.0, NAN, torch.tensor(2.0), torch.tensor(NAN), torch.tensor(-INF), INF, torch.tensor(0.5),
              torch.tensor([1.0, NAN, INF]), torch.tensor([1.0, 2.0]), torch.tensor(INF, dtype=torch.float16)]
    counter = NonFiniteCounter()
    for loss in losses:
        counter.add(loss)
    assert counter.exact() == 6
    assert counter.poll() == 6


def test_no_host_read_per_step(monkeypatch):
    """A tensor loss is never read back during a step: the counter stays a tensor until a report is due."""
    reads = []
    for name in ("item", "cpu", "tolist", "__int__", "__float__", "__bool__", "numpy"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name,
                            lambda self, *a, _name=name, _original=original, **k: reads.append(_name)
                            or _original(self, *a, **k))
    telemetry = StepTelemetry(Sent(), report_every_s=3600, clock=Clock())
    for step in range(1, 201):
        telemetry.on_step(step, loss=torch.tensor(NAN if step % 7 == 0 else 1.0, requires_grad=True) * 2)
    assert reads == []
    counter = next(iter(telemetry.nan._tallies.values())).finite
    assert isinstance(counter, torch.Tensor) and counter.dtype == torch.int64
    monkeypatch.undo()
    assert telemetry.close()["nan_steps"] == 200 // 7


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_loss_adds_no_device_sync_even_when_a_report_is_due():
    """With CUDA's sync debug mode set to raise, steps (each reporting) pass; close() then counts exactly."""
    telemetry = StepTelemetry(Sent(), report_every_s=0.0)
    torch.cuda.set_sync_debug_mode("error")
    try:
        for step in range(1, 101):
            loss = torch.full((), NAN if step % 10 == 0 else 1.0, device="cuda") * 2
            telemetry.on_step(step, loss=loss)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    final = telemetry.close()
    assert final["nan_steps"] == 10 and final["memory"] == "gpu" and final["peak_memory_bytes"] > 0


def test_reports_are_batched_and_steps_per_second_is_the_recent_rate():
    """One report per interval (not per step), the rate over the last interval, and an exact final one."""
    sent, clock = Sent(), Clock()
    telemetry = StepTelemetry(sent, report_every_s=5.0, clock=clock)
    for step in range(1, 61):  # 60 steps at 2 steps/s: 30 s
        telemetry.on_step(step)
        clock.now += 0.5
    reports = sent.ops("telemetry")
    assert 5 <= len(reports) <= 6
    assert all(r["steps_per_second"] == pytest.approx(2.0) for r in reports)
    for step in range(61, 71):  # then 4 steps/s
        telemetry.on_step(step)
        clock.now += 0.25
    final = telemetry.close()
    assert final["final"] and final["steps"] == 70 and final["nan_steps"] is None
    assert sent.ops("telemetry")[-1]["steps_per_second"] == pytest.approx(4.0, rel=0.2)
    assert telemetry.close() is None  # once


def test_a_commit_brings_the_next_report_forward():
    """report_soon() (a checkpoint committed) makes the next step report, whatever the interval."""
    sent, clock = Sent(), Clock()
    telemetry = StepTelemetry(sent, report_every_s=3600, clock=clock)
    for step in (1, 2):
        telemetry.on_step(step)
        clock.now += 1
    assert sent.messages == []
    telemetry.report_soon()
    telemetry.on_step(3)
    assert [m["steps"] for m in sent.ops("telemetry")] == [3]
    assert sent.ops("telemetry")[0]["steps_per_second"] == pytest.approx(1.0)


def test_a_repeated_step_counts_once_and_its_loss_still_counts():
    """steps counts distinct steps; every reported loss is counted."""
    telemetry = StepTelemetry(None)
    telemetry.on_step(5, loss=NAN)
    telemetry.on_step(5, loss=NAN)
    telemetry.on_step(6)
    assert telemetry.steps == 2 and telemetry.nan_steps == 2


def test_a_loss_that_is_not_a_number_is_refused_by_name():
    """step(loss='high') says what loss takes."""
    with pytest.raises(TypeError, match=r"step\(loss=...\): expected a float or a tensor, got str"):
        StepTelemetry(None).on_step(1, loss="high")


def test_peak_memory_on_a_cpu_node_is_the_process_peak_rss():
    """Without CUDA the peak is the process's peak resident set, in bytes."""
    if torch.cuda.is_initialized():  # asked at run time: an earlier test in this worker may have used the GPU
        pytest.skip("this process uses CUDA")
    peak, where = peak_memory()
    assert where == "host"
    with open("/proc/self/status") as status:
        hwm_kib = next(int(line.split()[1]) for line in status if line.startswith("VmHWM"))
    assert peak == pytest.approx(hwm_kib * 1024, rel=0.2)


def test_the_manifest_names_commit_versions_packages_and_argv_never_the_environment(tmp_path, monkeypatch):
    """git commit and dirtiness of the workdir, Python and torch versions, the packages' hash, argv; no env."""
    monkeypatch.setenv("SECRET_TOKEN", "hunter2-very-secret")
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-C", str(repo)]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "train.py").write_text("print(1)\n")
    subprocess.run([*git, "add", "train.py"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "one"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()

    manifest = run_manifest(cwd=str(repo))
    assert sorted(manifest) == ["argv", "cuda", "git_commit", "git_dirty", "gpus", "packages_sha256", "python",
                                "torch"]
    assert (manifest["git_commit"], manifest["git_dirty"]) == (head, False)
    assert manifest["python"] == ".".join(map(str, sys.version_info[:3]))
    assert manifest["torch"] == torch.__version__ and manifest["argv"] == sys.argv
    lines = sorted({f"{d.metadata['Name'].lower()}=={d.version}" for d in importlib.metadata.distributions()})
    assert manifest["packages_sha256"] == hashlib.sha256("\n".join(lines).encode()).hexdigest()
    assert "hunter2" not in json.dumps(manifest)

    (repo / "train.py").write_text("print(2)\n")
    (repo / "untracked.txt").write_text("not part of the commit\n")
    assert git_state(str(repo)) == (head, True)
    assert git_state(str(tmp_path)) == (None, None)  # not a repository

    shipped = tmp_path / "shipped"  # the workdir on a node: no .git, the state recorded at submission
    shipped.mkdir()
    (shipped / SOURCE_FILE).write_bytes(source_record(repo))
    assert (run_manifest(cwd=str(shipped))["git_commit"], run_manifest(cwd=str(shipped))["git_dirty"]) == (head, True)
    assert run_manifest(cwd=str(tmp_path))["git_commit"] is None


def test_only_rank_zero_sends_the_manifest_and_only_once():
    """Under torch.distributed the manifest comes from rank 0; a second restore sends nothing."""
    lead, other = Sent(), Sent()
    StepTelemetry(other, rank=1).send_manifest()
    telemetry = StepTelemetry(lead, rank=0)
    assert telemetry.send_manifest() is not None and telemetry.send_manifest() is None
    assert (len(lead.ops("manifest")), other.messages) == (1, [])


def test_the_checkpointer_reports_manifest_nan_steps_and_a_final_report_before_closed(setup, tmp_path, agent):
    """ckpt.step(step, loss=...): the manifest at restore, telemetry with exact NaN steps before 'closed'."""
    with setup.checkpointer(tmp_path / "ckpt", interval="1h") as ckpt:
        start = ckpt.restore()
        for step in range(start + 1, start + 31):
            setup.train(1)
            ckpt.step(step, loss=torch.tensor(NAN) if step in (4, 9, 20) else torch.tensor(0.1))
    agent.wait_for("closed")
    final = [m for m in agent.messages if m["op"] == "telemetry"][-1]
    assert final["final"] and final["attempt"] == 2
    assert (final["steps"], final["nan_steps"]) == (30, 3)
    # "gpu" once this worker's process has used CUDA (an earlier test on a GPU machine), as the library defines it
    assert final["peak_memory_bytes"] > 0 and final["memory"] == ("gpu" if torch.cuda.is_initialized() else "host")
    ops = [m["op"] for m in agent.messages]
    assert ops.count("manifest") == 1 and ops.index("manifest") < ops.index("closed")
    assert ops.index("telemetry") < ops.index("closed")
    assert agent.wait_for("manifest")[0]["manifest"]["torch"] == torch.__version__


def test_the_run_manifest_is_worked_out_outside_the_restores_pause(setup, tmp_path, agent, monkeypatch):
    """Hashing the installed packages' list takes up to 2 s on a busy node: the manifest is worked out in the
    background from the Checkpointer's construction, restore() does not wait for it (the ledger's
    restore_seconds is the whole pause), and it is sent once it is ready, before ``closed``."""
    import threading

    from runner.checkpoint import run_manifest as module

    release, started = threading.Event(), threading.Event()
    real = module.run_manifest

    def slow_manifest(*args, **kwargs):
        started.set()
        release.wait(120)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, "run_manifest", slow_manifest)
    ckpt = setup.checkpointer(tmp_path / "ckpt", interval="1h")
    assert started.wait(30)  # under way from the construction, before restore() is called
    restored = []
    restoring = threading.Thread(target=lambda: restored.append(ckpt.restore()), daemon=True)
    restoring.start()
    restoring.join(60)
    try:
        assert restored == [0], "restore() waited for the run manifest"
        assert agent.wait_for("restored")[0]["step"] == 0
        assert not [m for m in agent.messages if m["op"] == "manifest"]  # still being worked out
    finally:
        release.set()
    assert agent.wait_for("manifest", timeout=60)[0]["manifest"]["torch"] == torch.__version__
    ckpt.close()
    assert [m["op"] for m in agent.messages].count("manifest") == 1


def test_without_a_loss_nan_steps_is_null(setup, tmp_path, agent):
    """A loop that never passes loss reports nan_steps null, not 0."""
    with setup.checkpointer(tmp_path / "ckpt", interval="1h") as ckpt:
        for step in range(1, 4):
            ckpt.step(step)
    agent.wait_for("closed")
    final = [m for m in agent.messages if m["op"] == "telemetry"][-1]
    assert (final["steps"], final["nan_steps"]) == (3, None)


def test_reports_carry_the_wall_clock_time_of_the_first_and_the_newest_step():
    """first_step/first_step_at stay the first step's; last_step/last_step_at follow the newest distinct step."""
    sent, clock, wall = Sent(), Clock(), Clock()
    wall.now = 1_790_000_000.0
    telemetry = StepTelemetry(sent, report_every_s=5.0, clock=clock, wall=wall)
    for step in range(41, 61):
        telemetry.on_step(step)
        telemetry.on_step(step)  # the same step again (a loop waiting for its notice): its time stays the first
        clock.now += 0.5
        wall.now += 0.5
    final = telemetry.close()
    assert (final["first_step"], final["first_step_at"]) == (41, 1_790_000_000.0)
    assert (final["last_step"], final["last_step_at"]) == (60, 1_790_000_000.0 + 19 * 0.5)
    assert all(r["first_step"] == 41 and r["first_step_at"] == 1_790_000_000.0 for r in sent.ops("telemetry"))


def test_restore_seconds_is_reported_and_a_restore_alone_still_gets_its_final_report(setup, tmp_path, agent):
    """restore() is timed; a process that restored and then stopped before its first step reports it at close."""
    with setup.checkpointer(tmp_path / "ckpt", interval="1h") as ckpt:
        ckpt.restore()
    agent.wait_for("closed")
    final = [m for m in agent.messages if m["op"] == "telemetry"][-1]
    assert final["final"] and final["restore_seconds"] >= 0 and final["steps"] == 0
    assert (final["first_step"], final["last_step_at"]) == (None, None)


def test_an_emergency_reports_the_last_step_before_it_says_stopping(setup, tmp_path, agent):
    """The attempt may end at the handover, before close(): the step it stopped at, with its time, comes first."""
    ckpt = setup.checkpointer(tmp_path / "ckpt", interval="1h")
    ckpt.restore()
    agent.wait_for("hello")
    before = time.time()
    agent.send({"op": "checkpoint", "reason": "notice", "deadline": time.time() + 60, "stop": True})
    step = 0
    while not ckpt.should_stop and step < 100_000:  # the request is served at the step after it arrives
        step += 1
        setup.train(1)
        ckpt.step(step)
        time.sleep(0.002)
    agent.wait_for("stopping")
    ops = [m["op"] for m in agent.messages]
    report = [m for m in agent.messages[:ops.index("stopping")] if m["op"] == "telemetry"][-1]
    assert report["last_step"] == step and before <= report["last_step_at"] <= time.time()
    assert not report["final"]
    ckpt.close()
