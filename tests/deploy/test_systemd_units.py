"""The systemd units in deploy/: valid for systemd, notify services, hardened, and timed for a preemption."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agents.main import SHUTDOWN_GRACE_SECONDS
from agents.reporter import REGISTER_PATIENCE_SECONDS

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
UNITS = ["runner-server.service", "runner-agent.service"]
INSTALLED_RUNNER = "/opt/runner/venv/bin/runner"
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
needs_systemd_analyze = pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed")


def settings(name: str) -> dict[str, list[str]]:
    """``Section.Key`` -> every value given for it, in order (systemd allows repeated keys)."""
    found: dict[str, list[str]] = {}
    section = ""
    for line in (DEPLOY / name).read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        found.setdefault(f"{section}.{key.strip()}", []).append(value.strip())
    return found


def seconds(value: str) -> float:
    units = {"min": 60, "ms": 0.001, "s": 1, "h": 3600}
    for suffix, factor in units.items():
        if value.endswith(suffix):
            return float(value[: -len(suffix)]) * factor
    return float(value)


def rendered(name: str, folder: Path) -> Path:
    """A copy of the unit whose ExecStart names this environment's `runner` (verify requires it to exist)."""
    runner = Path(sys.executable).with_name("runner")
    assert runner.exists(), f"{runner} missing: install the project with pip install -e ."
    text = (DEPLOY / name).read_text()
    assert INSTALLED_RUNNER in text
    path = folder / name
    path.write_text(text.replace(INSTALLED_RUNNER, str(runner)))
    return path


@needs_systemd_analyze
@pytest.mark.parametrize("name", UNITS)
def test_unit_passes_systemd_analyze_verify(name: str, tmp_path: Path):
    """`systemd-analyze verify` accepts the unit without a single warning."""
    unit = rendered(name, tmp_path)
    result = subprocess.run([SYSTEMD_ANALYZE, "verify", "--man=no", str(unit)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), result.stdout + result.stderr


@needs_systemd_analyze
def test_controller_unit_is_hardened(tmp_path: Path):
    """systemd rates the controller's sandbox at exposure 2.0 or better (of 10)."""
    unit = rendered("runner-server.service", tmp_path)
    result = subprocess.run([SYSTEMD_ANALYZE, "security", "--offline=true", "--threshold=20", str(unit)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr


@pytest.mark.parametrize("name", UNITS)
def test_units_are_notify_services_with_a_watchdog(name: str):
    """Both daemons start as Type=notify (only the main process may notify), with a watchdog and restart on failure."""
    unit = settings(name)
    assert unit["Service.Type"] == ["notify"]
    assert unit["Service.NotifyAccess"] == ["main"]
    assert seconds(unit["Service.WatchdogSec"][-1]) >= 10
    assert unit["Service.Restart"] == ["on-failure"]


def test_controller_runs_as_its_own_user_writing_only_its_data_dir():
    """The controller runs as `runner`, with a read-only system except the data dir it is given."""
    unit = settings("runner-server.service")
    argv = shlex.split(unit["Service.ExecStart"][0])
    data_dir = argv[argv.index("--data-dir") + 1]
    assert unit["Service.User"] == ["runner"]
    assert unit["Service.ProtectSystem"] == ["strict"] and unit["Service.ProtectHome"] == ["yes"]
    assert data_dir in unit["Service.ReadWritePaths"][0].split()
    assert f"RUNNER_HOME={data_dir}" in unit["Service.Environment"]


def test_agent_unit_leaves_time_for_an_emergency_checkpoint():
    """At shutdown only the agent gets SIGTERM, and systemd waits longer than AWS's 2-minute notice is long."""
    unit = settings("runner-agent.service")
    assert unit["Service.KillMode"] == ["mixed"]
    assert seconds(unit["Service.TimeoutStopSec"][0]) >= max(120, SHUTDOWN_GRACE_SECONDS)
    assert "network-online.target" in unit["Unit.After"][0].split()  # stopped before the network at shutdown


def test_agent_unit_waits_for_registration():
    """The start timeout outlasts the agent's own patience for registering with the controller."""
    unit = settings("runner-agent.service")
    assert seconds(unit["Service.TimeoutStartSec"][0]) > REGISTER_PATIENCE_SECONDS


def test_agent_unit_keeps_what_a_training_job_needs():
    """The agent is not sandboxed away from GPUs, the file system or root, which the job it runs needs."""
    unit = settings("runner-agent.service")
    for key in ("User", "ProtectSystem", "ProtectHome", "PrivateDevices", "ProtectKernelModules", "DevicePolicy"):
        assert f"Service.{key}" not in unit, key
