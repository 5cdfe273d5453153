"""A launcher (the controller) killed between starting a simulated node's process and recording it must leave no
node that no controller can find: such a node would train, and on a cloud bill, for nobody. The node does nothing
until its ref is on disk, so it ends by itself; the next launch of it starts it again and a terminate without a ref
finds nothing left. The kill comes at that exact moment from a test hook (node_start_crash_hook), not by chance."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import Controller, write_job
from runner.providers.base import LaunchRequest, NodeBootstrap
from runner.providers.local import LocalProvider
from runner.providers.local.processes import ref_alive

HOOK = Path(__file__).resolve().parent / "node_start_crash_hook"
NODE_ID = "n-1"
# A launch as a controller asks for it, in a process of its own that the hook kills once the node's process starts.
LAUNCH = """
import sys
from pathlib import Path
from runner.providers.base import LaunchRequest, NodeBootstrap
from runner.providers.local import LocalProvider
provider = LocalProvider(Path(sys.argv[1]))
provider.launch(LaunchRequest(sys.argv[2], "job-1", 1, provider.offers()[0], True,
                              NodeBootstrap("http://127.0.0.1:9", sys.argv[2], "token")))
"""
NOT_STARTED = "its launcher stopped before recording this node; not starting"


def _hooked_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNNER_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(HOOK), os.environ.get("PYTHONPATH"))))
    return {**env, **(extra or {})}


def _launch_and_die_once_the_node_starts(data_dir: Path) -> None:
    result = subprocess.run([sys.executable, "-c", LAUNCH, str(data_dir), NODE_ID], capture_output=True, text=True,
                            timeout=120, env=_hooked_env({"RUNNER_TEST_DIE_AFTER_NODE_START": "1"}))
    assert result.returncode == -signal.SIGKILL, result.stderr
    assert (data_dir / "nodes" / NODE_ID / "node.log").exists()  # its process was started


def _kill_what_runs_from(node_dir: Path) -> None:
    """Kill any process started with ``node_dir`` on its command line (a node that no ref names)."""
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and str(node_dir) in (entry / "cmdline").read_bytes().decode(errors="replace"):
                os.kill(int(entry.name), signal.SIGKILL)
        except OSError:
            continue


def _wait_until(predicate, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_terminate_without_a_ref_leaves_nothing_of_a_node_whose_launcher_died_before_recording_it(tmp_path):
    """The release of a node whose launch never answered (the node row has no ref) finds nothing running after it."""
    node_dir = tmp_path / "nodes" / NODE_ID
    try:
        _launch_and_die_once_the_node_starts(tmp_path)
        provider = LocalProvider(tmp_path)
        provider.terminate(NODE_ID, None)
        assert provider.describe(NODE_ID, None).alive is False, "a node process runs that no ref names"
        assert not (node_dir / "ref").exists() and NOT_STARTED in (node_dir / "node.log").read_text()
    finally:
        _kill_what_runs_from(node_dir)


def test_the_next_launch_of_a_node_whose_launcher_died_before_recording_it_starts_it(tmp_path):
    """A launch asked for again after the launcher's death (the next leader's) returns a running node's ref."""
    node_dir = tmp_path / "nodes" / NODE_ID
    provider = LocalProvider(tmp_path)
    ref = None
    try:
        _launch_and_die_once_the_node_starts(tmp_path)
        request = LaunchRequest(NODE_ID, "job-1", 1, provider.offers()[0], True,
                                NodeBootstrap("http://127.0.0.1:9", NODE_ID, "token"))
        ref = provider.launch(request)
        assert ref_alive(ref) and (node_dir / "ref").read_text() == ref
        _wait_until(lambda: (node_dir / "metadata.json").exists(), "the node to pass its gate and start")
        assert provider.describe(NODE_ID, ref).alive
    finally:
        if ref:
            provider.terminate(NODE_ID, ref)
        _kill_what_runs_from(node_dir)


JOB = """
name: once
run: echo "ran attempt $RUNNER_ATTEMPT"
resources: {cloud: [local]}
recovery: {resume_drill: "off"}
"""


def test_a_controller_killed_between_starting_a_node_and_recording_it_leaves_no_node_running_for_nobody(
        home, runner, tmp_path):
    """The controller dies right after its node's process starts. That process ends by itself, the restarted
    controller launches the node again, the job runs once on it, and when it ends no node process is left."""
    hooked = Controller(home, env={"PYTHONPATH": _hooked_env()["PYTHONPATH"], "RUNNER_TEST_DIE_AFTER_NODE_START": "1"})
    hooked.start()
    runner.env.update({"RUNNER_SERVER": hooked.url, "RUNNER_TOKEN": hooked.token})
    runner("submit", str(write_job(tmp_path / "job", JOB)))  # (its answer may be lost with the controller)
    hooked.process.wait(120)
    assert hooked.process.returncode == -signal.SIGKILL
    [node_dir] = (home / "nodes").iterdir()
    try:
        _wait_until(lambda: (node_dir / "ref").exists() or not LocalProvider(home).describe(node_dir.name, None).alive,
                    "the node process that no ref names to end")
        assert not (node_dir / "ref").exists()
        restarted = Controller(home).start()
        try:
            runner.env.update({"RUNNER_SERVER": restarted.url})
            [job] = runner.json("jobs")
            final = runner.wait_for(job["id"], lambda j: j["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"),
                                    timeout=120, what="the job to end")
            assert final["state"] == "SUCCEEDED", final
            assert [r["end_reason"] for r in runner.restarts(job["id"])] == ["succeeded"]
            assert runner.output(job["id"]).count("ran attempt 1") == 1
            assert [path.name for path in (home / "nodes").iterdir()] == [node_dir.name]  # launched again, once
            _wait_until(lambda: not LocalProvider(home).describe(node_dir.name, None).alive,
                        "the node to be released after the job's end")
        finally:
            restarted.stop()
    finally:
        _kill_what_runs_from(node_dir)
