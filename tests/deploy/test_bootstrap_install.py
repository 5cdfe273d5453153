"""The real bootstrap script brings a node to life: it fetches its controller's wheel with the node's token,
installs the runner from that file alone (no package index), writes the agent's config, starts the unit,
and the node registers and runs its job.

The node is a throwaway folder (bootstrap_market.py): ``python3 -m venv`` is real, and so are pip and the
unit's ExecStart; ``systemctl`` is a stand-in that starts the unit's ExecStart in the node's folder. The
wheel's dependencies are this test's own installed packages (the shim's venvs see them), so nothing is
downloaded.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import stat
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import pytest
import requests
import yaml

from conftest import Runner, write_job
from runner import __version__
from runner.distribution import DIST_NAME, wheel_filename
from runner.providers.local.processes import kill_session

MARKET = Path(__file__).with_name("bootstrap_market.py")
REPO = Path(__file__).resolve().parents[2]

PYTHON3 = f"""#!/bin/bash
# python3 of the throwaway node: this test's Python; a venv it makes also sees this test's installed packages
# (a .pth line), so that pip finds the runner's dependencies installed and needs no index.
if [ "${{1:-}}" = "-m" ] && [ "${{2:-}}" = "venv" ]; then
  {sys.executable} "$@" || exit $?
  venv="${{!#}}"
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo {sysconfig.get_paths()["purelib"]} > "$site/zz_test_dependencies.pth"
  exit 0
fi
exec {sys.executable} "$@"
"""

SYSTEMCTL = f"""#!{sys.executable}
# systemctl of the throwaway node: daemon-reload does nothing; enable --now starts the unit's ExecStart with
# its folders mapped into the node's, in the node's process session (and with its inherited files: the
# local market's liveness lock).
import os, shlex, subprocess, sys
from pathlib import Path

args = sys.argv[1:]
if args == ["daemon-reload"]:
    sys.exit(0)
assert args[:2] == ["enable", "--now"], args
unit = (Path(os.environ["RUNNER_UNIT_DIR"]) / args[2]).read_text()
command = next(line.split("=", 1)[1] for line in unit.splitlines() if line.startswith("ExecStart="))
for real, variable in (("/opt/runner", "RUNNER_OPT_DIR"), ("/etc/runner", "RUNNER_ETC_DIR"),
                       ("/var/lib/runner", "RUNNER_STATE_DIR")):
    command = command.replace(real, os.environ[variable])
env = {{k: v for k, v in os.environ.items() if not k.startswith("RUNNER_")}}
with open(Path(os.environ["RUNNER_STATE_DIR"]) / "agent.out", "ab") as out:
    subprocess.Popen(shlex.split(command), stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env,
                     close_fds=False)
"""

JOB = """
name: bootstrapped
run: echo "hello from a bootstrapped node" && sleep 600
resources: {cloud: [local]}
recovery: {resume_drill: "off", max_failures: 0}
"""


def _shims(folder: Path) -> Path:
    folder.mkdir()
    for name, text in (("python3", PYTHON3), ("systemctl", SYSTEMCTL)):
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    return folder


@pytest.fixture(scope="module")
def market(tmp_path_factory):
    """A controller whose nodes bootstrap for real, and a job it ran on one."""
    base = tmp_path_factory.mktemp("bootstrap")
    home = base / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNNER_")}
    env.update(RUNNER_HOME=str(home), PYTHONPATH=str(REPO))
    controller = subprocess.Popen([sys.executable, str(MARKET), str(home), str(_shims(base / "shims"))], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not (home / "controller.json").exists():
            assert controller.poll() is None, controller.stdout.read().decode()
            assert time.monotonic() < deadline, "the controller did not start"
            time.sleep(0.1)
        url = json.loads((home / "controller.json").read_text())["url"]
        runner = Runner(home)
        runner.env.update({"RUNNER_SERVER": url, "RUNNER_TOKEN": (home / "admin-token").read_text().strip()})
        job_id = runner.json("submit", str(write_job(base / "job", JOB)))["id"]
        job = runner.wait_for(job_id, lambda j: j["state"] in ("RUNNING", "FAILED"), timeout=420,
                              what="the bootstrapped node's job running")
        yield runner, url, home, job_id, job
    finally:
        for ref in home.glob("nodes/*/ref"):
            kill_session(int(ref.read_text().split(":")[0]))
        os.killpg(controller.pid, signal.SIGTERM)
        controller.wait(30)


def _node_dir(home: Path) -> Path:
    node_dir, = home.glob("nodes/*/root")
    return node_dir.parent


def test_a_node_installs_the_runner_from_its_controller_and_runs_its_job(market):
    """The node's bootstrap installs the controller's wheel, the agent registers and runs the job."""
    runner, _, home, job_id, job = market
    node_dir = _node_dir(home)
    assert job["state"] == "RUNNING", (node_dir / "node.log").read_text()[-3000:]
    runner.wait_for_output(job_id, "hello from a bootstrapped node")
    attempt, = runner.json("restarts", job_id)
    assert attempt["node"] == node_dir.name and attempt["end_reason"] == "running"
    venv = node_dir / "root" / "opt" / "runner" / "venv"
    installed, = venv.glob(f"lib/python*/site-packages/{DIST_NAME.replace('-', '_')}-{__version__}.dist-info")
    assert (installed.parent / "runner" / "__init__.py").is_file()  # the package itself is in the node's venv
    direct = json.loads((installed / "direct_url.json").read_text())  # installed from the fetched file
    assert direct["url"].startswith("file://") and direct["url"].endswith(wheel_filename())
    config = yaml.safe_load((node_dir / "root" / "etc" / "runner" / "agent.yaml").read_text())
    assert config["node_id"] == node_dir.name
    assert stat.S_IMODE((node_dir / "root" / "etc" / "runner" / "agent.yaml").stat().st_mode) == 0o600


def test_the_wheel_is_served_to_a_live_node_token_only(market):
    """GET /v1/agent/wheel: 401 without a token, with a token of no node or of a node released since, 403 for the
    admin's; a live node's token gets the controller's own wheel."""
    runner, url, home, job_id, _ = market
    wheel_url = url + "/v1/agent/wheel"
    assert requests.get(wheel_url, timeout=60).status_code == 401
    assert requests.get(wheel_url, headers={"Authorization": "Bearer " + "0" * 64}, timeout=60).status_code == 401
    admin = {"Authorization": "Bearer " + runner.env["RUNNER_TOKEN"]}
    assert requests.get(wheel_url, headers=admin, timeout=60).status_code == 403
    token = yaml.safe_load((_node_dir(home) / "root" / "etc" / "runner" / "agent.yaml").read_text())["token"]
    answer = requests.get(wheel_url, headers={"Authorization": f"Bearer {token}"}, timeout=300)
    assert answer.status_code == 200
    assert wheel_filename() in answer.headers["content-disposition"]
    with zipfile.ZipFile(io.BytesIO(answer.content)) as wheel:
        names = wheel.namelist()
        metadata = wheel.read(f"{DIST_NAME.replace('-', '_')}-{__version__}.dist-info/METADATA").decode()
    assert re.search(rf"^Name: {DIST_NAME}$", metadata, re.M) and re.search(rf"^Version: {__version__}$", metadata, re.M)
    assert "runner/__init__.py" in names and "agents/main.py" in names
    assert "runner/providers/bootstrap.sh" in names  # package data comes along
    assert runner("cancel", job_id).returncode == 0
    runner.wait_for(job_id, lambda j: j["state"] == "CANCELLED", what="cancelled")
    deadline = time.monotonic() + 60
    while requests.get(wheel_url, headers={"Authorization": f"Bearer {token}"}, timeout=60).status_code != 401:
        assert time.monotonic() < deadline, "a released node's token still fetches the wheel"
        time.sleep(0.5)
