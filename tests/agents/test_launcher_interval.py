"""How long a gang's launcher may outlive its node's training processes before the agent takes it to wait at its exit
barrier follows how often the launcher looks at its workers (agents/launcher_interval.py).

torchrun sees a failed worker only at its next look (``--monitor-interval``): with ``--monitor-interval 5`` a launcher
whose worker failed may still run 5 s after it, and the fixed 3 s would take it for one waiting at its exit barrier
(node 0 would report its part done, another node's launcher would be ended as finished). The interval is read from the
launcher's own process (its arguments, its environment, the torch it imported), so a launcher started by a script
the job's command runs is seen too; the job's command and environment say it otherwise.
"""

from __future__ import annotations

import io
import os
import shutil
import sys
import textwrap
import time
from pathlib import Path

import pytest

from agents import process_tree
from agents.launcher_interval import (
    _torch_default, interval_in_command, interval_of_launcher, launcher_arguments, launcher_linger, linger_for,
    monitor_interval,
)
from agents.supervisor import Supervisor

TORCHRUN = Path(sys.executable).parent / "torchrun"


def test_the_linger_is_3_s_at_torchs_default_and_longer_for_a_launcher_that_looks_seldom():
    assert linger_for(0.1) == 3.0
    assert linger_for(1.0) == 3.0
    assert linger_for(5.0) == 11.0


@pytest.mark.parametrize("command, env, interval", [
    ("torchrun --nnodes=2 --monitor-interval 5 train.py", {}, 5.0),
    ("torchrun --nnodes=2 --monitor-interval=5 train.py", {}, 5.0),
    ("python -m torch.distributed.run --monitor_interval 2.5 train.py --lr 1", {}, 2.5),
    ("torchrun --monitor-interval=$INTERVAL train.py", {"INTERVAL": "4"}, 4.0),
    ("torchrun --monitor-interval ${INTERVAL} train.py", {"INTERVAL": "4"}, 4.0),
    ("torchrun --nnodes=2 train.py", {"PET_MONITOR_INTERVAL": "5"}, 5.0),  # torchrun reads it without the flag
    ("torchrun --monitor-interval 1 train.py", {"PET_MONITOR_INTERVAL": "5"}, 1.0),  # the flag wins
    ("torchrun --monitor-interval 5 train.py 'unbalanced", {}, 5.0),  # quoting shlex cannot follow
    ("torchrun --nnodes=2 train.py", {}, None),
    ("torchrun --monitor-interval 0 train.py", {}, None),  # torchrun refuses it
])
def test_the_jobs_command_and_environment_say_the_interval(command, env, interval):
    assert interval_in_command(command, env) == interval


@pytest.mark.parametrize("argv, args", [
    (["/venv/bin/python3", "/venv/bin/torchrun", "--nnodes", "2", "train.py"], ["--nnodes", "2", "train.py"]),
    (["python", "-u", "-m", "torch.distributed.run", "--standalone", "t.py"], ["--standalone", "t.py"]),
    (["python", "-X", "dev", "-m", "torch.distributed.launch", "t.py"], ["t.py"]),
    (["python", "-u", "train.py", "--monitor-interval", "5"], None),  # a worker, not the launcher
    (["/bin/bash", "-c", "torchrun --monitor-interval 5 t.py"], None),
    (["python", "-m", "http.server"], None),
])
def test_a_launcher_is_told_from_its_arguments(argv, args):
    assert launcher_arguments(argv) == args


def started(tmp_path: Path, command: str, ready: Path, env: dict | None = None) -> Supervisor:
    supervisor = Supervisor(command, str(tmp_path), {**os.environ, **(env or {})}, io.BytesIO())
    supervisor.start()
    deadline = time.monotonic() + 120
    while not ready.exists():
        assert supervisor.process.poll() is None, "the launcher exited before it was ready"
        assert time.monotonic() < deadline, "the launcher never got ready"
        time.sleep(0.05)
    return supervisor


@pytest.mark.skipif(not TORCHRUN.exists(), reason="torch's torchrun is not installed")
def test_a_real_torchrun_started_by_a_script_gives_its_interval_from_its_arguments(tmp_path):
    """The job's command runs a script that starts torchrun with ``--monitor-interval 5``: the command's text does not
    say it, the launcher's process does; its linger is 11 s. Without the flag, the default of the torch it imported
    (0.1 s since torch 2.4) leaves it 3 s."""
    worker, ready = tmp_path / "worker.py", tmp_path / "ready"
    worker.write_text(f"import pathlib, time\npathlib.Path({str(ready)!r}).touch()\ntime.sleep(600)\n")
    for flag, linger in (("--monitor-interval 5", 11.0), ("", 3.0)):
        ready.unlink(missing_ok=True)
        (tmp_path / "launch.sh").write_text(
            f"{TORCHRUN} --standalone --nproc-per-node 1 {flag} {worker}\n")
        supervisor = started(tmp_path, "bash launch.sh", ready)
        try:
            assert launcher_linger(supervisor)() == linger
            launchers = [p.pid for p in process_tree.members(supervisor.process.pid, supervisor.mark)
                         if interval_of_launcher(p.pid) is not None]
            assert len(launchers) == 1  # torchrun, not its worker nor the script's shell
            assert _torch_default(launchers[0]) == 0.1  # the torch it imported: this one, 2.4 or later
        finally:
            supervisor.stop(2.0)
            supervisor.wait()


def fake_launcher(tmp_path: Path, torch_version: str, ready: Path) -> Path:
    """A process shaped as torchrun (its console script's name) that maps a library of a torch of the given version,
    as torchrun's import of torch does."""
    torch = tmp_path / f"site-{torch_version}" / "torch"
    (torch / "lib").mkdir(parents=True)
    (torch / "version.py").write_text(f"__version__ = '{torch_version}'\n")
    (torch / "lib" / "libtorch_cpu.so").write_bytes(b"\0" * 4096)
    script = tmp_path / "bin" / "torchrun"
    script.parent.mkdir(exist_ok=True)
    script.write_text(textwrap.dedent(f"""\
        import mmap, pathlib, time
        with open({str(torch / "lib" / "libtorch_cpu.so")!r}, "rb") as f:
            mapped = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        pathlib.Path({str(ready)!r}).touch()
        time.sleep(600)
        """))
    return script


@pytest.mark.parametrize("version, linger", [("2.3.1", 11.0), ("2.4.0", 3.0)])
def test_without_a_flag_the_default_of_the_launchers_torch_applies(tmp_path, version, linger):
    """torch before 2.4 looked every 5 s by default, from 2.4 every 0.1 s."""
    ready = tmp_path / "ready"
    script = fake_launcher(tmp_path, version, ready)
    supervisor = started(tmp_path, f"{shutil.which('python3') or sys.executable} {script} --nnodes 2 train.py", ready)
    try:
        assert launcher_linger(supervisor)() == linger
    finally:
        supervisor.stop(2.0)
        supervisor.wait()


def test_the_environment_of_the_launcher_process_says_it_when_its_arguments_do_not(tmp_path):
    ready = tmp_path / "ready"
    script = fake_launcher(tmp_path, "2.13.0", ready)
    (tmp_path / "launch.sh").write_text(f"export PET_MONITOR_INTERVAL=5\nexec {sys.executable} {script} train.py\n")
    supervisor = started(tmp_path, "bash launch.sh", ready)
    try:
        assert monitor_interval(supervisor.process.pid, supervisor.mark, supervisor.command, supervisor.env) == 5.0
    finally:
        supervisor.stop(2.0)
        supervisor.wait()


def test_where_no_launcher_is_found_the_command_says_it(tmp_path):
    """A launcher the agent cannot see (another one, or one that has exited): the job's command gives it."""
    assert launcher_linger(None)() == 3.0
    supervisor = Supervisor("true --monitor-interval 5", str(tmp_path), dict(os.environ), io.BytesIO())
    supervisor.start()
    supervisor.wait()
    assert launcher_linger(supervisor)() == 11.0
