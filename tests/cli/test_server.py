"""The controller's daemon: auto-start, reuse, stop, one per data dir, clear errors at start."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from conftest import Controller, write_job


def test_first_command_starts_a_local_controller_and_later_ones_reuse_it(runner, home):
    """With no RUNNER_SERVER the CLI starts a controller once, says so in one line, and reuses it."""
    first = runner("jobs")
    assert first.returncode == 0, first.stderr
    assert first.stderr.count("Started a local controller") == 1
    second = runner("jobs")
    assert second.returncode == 0 and "Started" not in second.stderr
    assert oct((home / "admin-token").stat().st_mode & 0o777) == "0o600"
    stopped = runner("server", "stop")
    assert stopped.returncode == 0 and "stopped the controller" in stopped.stdout
    assert "no controller is running" in runner("server", "stop").stdout


def test_auto_started_controller_runs_a_job_end_to_end(tmp_path, runner, home):
    """The quickstart path: submit --follow with nothing configured succeeds."""
    job = write_job(tmp_path / "j", "name: auto\nrun: echo hello from the node\nrecovery: {resume_drill: 'off'}\n")
    try:
        result = runner("submit", str(job), "--follow")
        assert result.returncode == 0, result.stderr
        assert "hello from the node" in result.stdout
    finally:
        runner("server", "stop")


def test_a_second_controller_on_the_same_data_dir_is_refused(runner, controller, home):
    """Two controllers never share a data dir: the second exits 1 naming the first."""
    result = runner("server", "--data-dir", str(home), "--port", "0", timeout=30)
    assert result.returncode == 1
    assert "already serving" in result.stderr and controller.url in result.stderr


def test_a_port_in_use_is_a_clear_error(runner, tmp_path):
    """`runner server --port P` with P taken exits 1 and says to pick another port."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = runner("server", "--data-dir", str(tmp_path / "other"), "--port", str(port), timeout=30)
    assert result.returncode == 1
    assert "already in use" in result.stderr and "--port" in result.stderr
    assert "Traceback" not in result.stderr


def test_restarted_controller_keeps_jobs(tmp_path, runner, controller, home):
    """Jobs survive a clean controller restart (state is in SQLite)."""
    job = write_job(tmp_path / "j", "name: keep\nrun: echo kept\nrecovery: {resume_drill: 'off'}\n")
    job_id = runner.json("submit", str(job))["id"]
    runner.wait_for(job_id, lambda j: j["state"] == "SUCCEEDED", what="success")
    controller.stop()
    again = Controller(home, db_url=controller.db_url).start()
    runner.env["RUNNER_SERVER"] = again.url
    try:
        assert runner.json("status", job_id)["state"] == "SUCCEEDED"
    finally:
        again.stop()


@pytest.mark.parametrize("shape", ["as this version writes it", "as an older version wrote it"])
def test_server_stop_never_signals_a_process_that_took_a_dead_controllers_pid(runner, home, shape):
    """A controller.json left by a controller that died names a pid now someone else's: stop leaves it alone."""
    from runner.providers.local.processes import process_start_ticks

    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        record = {"url": "http://127.0.0.1:9", "pid": bystander.pid}
        if shape == "as this version writes it":
            record["started"] = process_start_ticks(bystander.pid) - 1  # the dead controller's start
        (home / "controller.json").write_text(json.dumps(record))
        result = runner("server", "stop")
        assert result.returncode == 0 and "no controller is running" in result.stdout
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()
