"""The local provider's simulated market, where it needs no node process: stockouts and full zones."""

from __future__ import annotations

import pytest

from runner.providers.base import LaunchRequest, NodeBootstrap
from runner.providers.errors import NoCapacityError
from runner.providers.local import LocalProvider


def _request(provider: LocalProvider, zone: str) -> LaunchRequest:
    offer = next(o for o in provider.offers() if o.zone == zone)
    return LaunchRequest("n-1", "job-1", 1, offer, True, NodeBootstrap("http://controller", "n-1", "token"))


def test_a_zone_named_in_no_capacity_refuses_launches_as_a_stockout(tmp_path):
    """clouds.local.no_capacity: a launch there raises NoCapacityError and starts nothing."""
    provider = LocalProvider(tmp_path, no_capacity=["local-a"])
    with pytest.raises(NoCapacityError, match="local-a"):
        provider.launch(_request(provider, "local-a"))
    assert not provider.node_dir("n-1").exists()


def test_a_zone_capacity_that_is_not_a_positive_whole_number_is_refused_naming_the_key(tmp_path):
    """clouds.local.zone_capacity: 0 is refused with the key's name."""
    with pytest.raises(ValueError, match="clouds.local.zone_capacity"):
        LocalProvider(tmp_path, zone_capacity=0)


@pytest.mark.parametrize("key, value", [("boot_seconds", -1), ("boot_seconds", "a minute"), ("boot_seconds", True),
                                        ("boot_seconds", float("inf")), ("durable_mb_per_s", 0),
                                        ("durable_mb_per_s", -200), ("durable_mb_per_s", "fast"),
                                        ("durable_mb_per_s", float("inf")), ("time_scale", "slow"),
                                        ("time_scale", float("inf"))])
def test_a_bad_number_of_the_slow_market_is_refused_naming_the_key(tmp_path, key, value):
    """clouds.local.boot_seconds (0 or more) and durable_mb_per_s (more than 0), both finite (YAML's .inf would be a
    node that never boots): any other value names its key."""
    with pytest.raises(ValueError, match=rf"clouds\.local\.{key}: .*{value!r}"):
        LocalProvider(tmp_path, **{key: value})


def test_the_slow_market_is_off_by_default_and_its_durable_tier_is_a_plain_folder(tmp_path):
    """Defaults keep today's speed: no boot delay, and the default durable_url is a file:// URL."""
    provider = LocalProvider(tmp_path)
    assert provider.boot_seconds == 0 and provider.durable_mb_per_s is None
    assert provider.default_checkpoint_url("job-1").startswith("file:///")
    slow = LocalProvider(tmp_path, durable_mb_per_s=200)
    assert slow.default_checkpoint_url("job-1") == "local-durable" + provider.default_checkpoint_url("job-1")[4:]


def test_runner_server_refuses_a_bad_slow_market_value_with_exit_2(tmp_path):
    """`runner server` with clouds.local.boot_seconds: -5 exits 2 with one line naming the key, no traceback."""
    import os
    import subprocess
    import sys

    import yaml

    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(yaml.safe_dump({"clouds": {"local": {"boot_seconds": -5}}}))
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("RUNNER_")}, "RUNNER_HOME": str(home)}
    result = subprocess.run([sys.executable, "-m", "runner.cli.main", "server", "--data-dir", str(home),
                             "--port", "0"], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "clouds.local.boot_seconds" in result.stderr and "Traceback" not in result.stderr


WORKER_IN_ITS_OWN_SESSION = """
import subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
print(worker.pid, flush=True)
time.sleep(600)
"""


def _kill(*pids: int) -> None:
    import os

    for pid in pids:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass


def test_terminating_a_node_ends_what_it_started_in_sessions_of_their_own(tmp_path):
    """A node's termination is a power-off: a process it started in a session of its own (torchrun's workers, a next
    attempt started ahead) ends with it."""
    import os
    import subprocess
    import sys
    import time

    from runner.providers.local.processes import process_ref, process_start_ticks

    provider = LocalProvider(tmp_path)
    node = subprocess.Popen([sys.executable, "-c", WORKER_IN_ITS_OWN_SESSION], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    worker = int(node.stdout.readline())
    try:
        assert os.getsid(worker) != os.getsid(node.pid)
        provider.terminate("n-1", process_ref(node.pid))
        node.wait(30)
        deadline = time.monotonic() + 30
        while process_start_ticks(worker) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert process_start_ticks(worker) is None
    finally:
        _kill(worker, node.pid)
        node.stdout.close()


def test_terminating_a_node_whose_pid_another_process_has_now_leaves_that_process_alone(tmp_path):
    """Pids wrap (at 32,768 on many machines, soon under a test suite): a node that ended long ago, terminated by
    its stale reference, must not kill the process that has its pid now, nor what that one started. (Killing by
    pid alone most likely ended another test's running node in a full run: its job was counted lost.)"""
    import subprocess
    import sys

    from runner.providers.local.processes import process_start_ticks

    provider = LocalProvider(tmp_path)
    stranger = subprocess.Popen([sys.executable, "-c", WORKER_IN_ITS_OWN_SESSION], stdout=subprocess.PIPE, text=True,
                                start_new_session=True)
    its_worker = int(stranger.stdout.readline())
    try:
        stale_ref = f"{stranger.pid}:{process_start_ticks(stranger.pid) - 1}"  # the pid, another start: a reuse
        provider.terminate("n-1", stale_ref)
        assert stranger.poll() is None and process_start_ticks(its_worker) is not None
    finally:
        _kill(its_worker, stranger.pid)
        stranger.wait(30)
        stranger.stdout.close()
