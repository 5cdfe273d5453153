"""WatchLoop: each notice once, the first terminal notice only, remembered across restarts, never a false alarm."""

import json
import threading
import time

import pytest

from agents.watchers import AWSWatcher, AzureWatcher, Notice, Watcher, WatcherError, WatchLoop, gcp_watchers
from runner.providers.local.metadata import FakeIMDS
from watcher_fixtures import imds, gce, azure, recorder, run_loop  # noqa: F401 - pytest fixtures


def aws(imds, **options):
    return AWSWatcher(imds.endpoint, interval=0.05, timeout=0.3, put_timeout=0.2, **options)


def gcp(gce):
    return gcp_watchers(gce.endpoint, wait_seconds=5, timeout=0.3)


def azure_watcher(azure):
    return AzureWatcher(azure.endpoint, interval=0.05, timeout=0.3, first_timeout=0.3)


class Scripted(Watcher):
    """A watcher that replays a script: a list of notices, or an exception to raise, per check."""

    source = "aws"
    interval = 0.01

    def __init__(self, script):
        self.script = list(script)
        self.checks = 0

    def check(self):
        self.checks += 1
        step = self.script.pop(0) if self.script else []
        if isinstance(step, Exception):
            raise step
        return step


def wait_for_errors(loop, count=2, timeout=4.0):
    """Let the loop fail `count` checks in a row (so it has really met the fault)."""
    end = time.monotonic() + timeout
    while loop.errors < count and time.monotonic() < end:
        time.sleep(0.02)
    assert loop.errors >= count


def test_each_notice_is_delivered_once(imds, recorder, run_loop):
    """A rebalance recommendation seen on every check reaches the callback once."""
    imds.set_rebalance()
    run_loop([aws(imds, rebalance_interval=0.05)])
    time.sleep(0.5)
    assert recorder.ids == ["aws:rebalance:rebalance"]


def test_only_the_first_terminal_notice_is_acted_on(imds, azure, recorder, run_loop):
    """After one terminal notice, a later terminal notice from another source is not delivered."""
    loop = run_loop([aws(imds), azure_watcher(azure)])
    imds.set_instance_action("terminate")
    assert loop.wait_terminal(3).source == "aws"
    azure.preempt(30)
    time.sleep(0.4)
    assert [n.source for _, n in recorder.notices if n.terminal] == ["aws"]
    assert loop.terminal.source == "aws"


def test_deadline_is_kept_on_the_monotonic_clock(imds, run_loop):
    """The terminal notice's deadline is expressed on time.monotonic()."""
    imds.set_instance_action("terminate", deadline_seconds=120)
    notice = run_loop([aws(imds)]).wait_terminal(3)
    assert 115 < notice.deadline_monotonic - time.monotonic() <= 120


def test_terminal_notice_is_remembered_across_a_restart(imds, recorder, run_loop, tmp_path):
    """A loop restarted with the same state file replays the terminal notice, marked replayed, at once."""
    state = tmp_path / "notice.json"
    imds.set_instance_action("terminate")
    run_loop([aws(imds)], state_path=state).wait_terminal(3)
    imds.reset()
    restarted = []
    loop = WatchLoop([aws(imds)], restarted.append, state_path=state).start()
    try:
        assert loop.wait_terminal(0) is not None
        assert [(n.id, n.replayed) for n in restarted] == [("aws:termination:terminate", True)]
        assert 100 < restarted[0].seconds_left() <= 120
    finally:
        loop.stop()


def test_replayed_notice_is_not_delivered_again_when_seen_again(imds, tmp_path):
    """After a restart, the notice still on the metadata server is not delivered a second time."""
    state = tmp_path / "notice.json"
    imds.set_instance_action("terminate")
    first = WatchLoop([aws(imds)], lambda n: None, state_path=state).start()
    first.wait_terminal(3)
    first.stop()
    seen = []
    loop = WatchLoop([aws(imds)], seen.append, state_path=state).start()
    time.sleep(0.3)
    loop.stop()
    assert len(seen) == 1 and seen[0].replayed


def test_a_notice_from_an_earlier_boot_is_forgotten(imds, tmp_path):
    """A state file written before a reboot (another boot id) is not replayed."""
    state = tmp_path / "notice.json"
    imds.set_instance_action("stop")
    first = WatchLoop([aws(imds)], lambda n: None, state_path=state, boot_id="boot-1").start()
    first.wait_terminal(3)
    first.stop()
    imds.reset()
    loop = WatchLoop([aws(imds)], lambda n: None, state_path=state, boot_id="boot-2").start()
    try:
        assert loop.terminal is None
    finally:
        loop.stop()


def test_a_corrupt_state_file_is_ignored(imds, tmp_path, recorder, run_loop):
    """An unreadable state file is logged and ignored; the loop still starts and watches."""
    state = tmp_path / "notice.json"
    state.write_text("{not json")
    loop = run_loop([aws(imds)], state_path=state)
    imds.set_instance_action("terminate")
    assert loop.wait_terminal(3) is not None
    assert json.loads(state.read_text())["terminal"]["action"] == "terminate"


AWS_FAULTS = {
    "401 on every GET": lambda s: s.add_fault("status", status=401, path="/latest/meta-data/"),
    "503 burst": lambda s: s.add_fault("status", status=503, count=20),
    "500 on everything": lambda s: s.add_fault("status", status=500),
    "garbage": lambda s: s.add_fault("garbage"),
    "slow": lambda s: s.add_fault("slow", delay=0.5),
    "token PUT dropped": lambda s: s.add_fault("drop", method="PUT"),
    "IMDS disabled": lambda s: s.set_disabled(),
    "server down": lambda s: s.stop(),
}


@pytest.mark.parametrize("fault", list(AWS_FAULTS))
def test_aws_faults_are_never_a_notice_and_the_loop_survives_them(imds, recorder, run_loop, fault):
    """Under each fault the loop reports nothing, keeps going, and sees the notice once the fault clears."""
    AWS_FAULTS[fault](imds)
    loop = run_loop([aws(imds)])
    wait_for_errors(loop)
    assert recorder.notices == []
    imds.start()  # no-op unless it was stopped
    imds.reset()
    imds.set_instance_action("terminate")
    assert loop.wait_terminal(3) is not None


@pytest.mark.parametrize("fault", ["503 burst", "garbage", "slow", "server down"])
def test_gcp_faults_are_never_a_notice(gce, recorder, run_loop, fault):
    """503s, garbage, slowness and a dead server on GCE give no notice; a real one is still seen after."""
    {"503 burst": lambda: gce.add_fault("status", status=503, count=30),
     "garbage": lambda: gce.add_fault("garbage"),
     "slow": lambda: gce.add_fault("slow", delay=0.5),
     "server down": gce.stop}[fault]()
    loop = run_loop(gcp(gce))
    wait_for_errors(loop)
    assert recorder.notices == []
    gce.start()
    gce.reset()
    gce.preempt(30)
    assert loop.wait_terminal(3) is not None


@pytest.mark.parametrize("fault", ["400", "503 burst", "garbage", "server down"])
def test_azure_faults_are_never_a_notice(azure, recorder, run_loop, fault):
    """400s, 503s, garbage and a dead server on Azure give no notice; a real one is still seen after."""
    {"400": lambda: azure.add_fault("status", status=400),
     "503 burst": lambda: azure.add_fault("status", status=503, count=30),
     "garbage": lambda: azure.add_fault("garbage"),
     "server down": azure.stop}[fault]()
    loop = run_loop([azure_watcher(azure)])
    wait_for_errors(loop)
    assert recorder.notices == []
    azure.start()
    azure.reset()
    azure.preempt(30)
    assert loop.wait_terminal(3) is not None


def test_recomputed_aws_time_gives_one_notice(recorder, run_loop):
    """The official mock's moving `time` still yields exactly one notice."""
    with FakeIMDS(recompute_time=True) as imds:
        imds.set_instance_action("terminate")
        run_loop([aws(imds)])
        time.sleep(1.2)
    assert recorder.ids == ["aws:termination:terminate"]


def test_both_gcp_keys_are_watched_concurrently(gce, recorder, run_loop):
    """While one hanging GET waits, a change to the other key is still seen at once."""
    run_loop(gcp(gce))
    time.sleep(0.3)  # both watchers are now inside hanging GETs
    gce.set_maintenance_event("TERMINATE_ON_HOST_MAINTENANCE")
    recorder.wait_for(lambda r: r.ids == ["gcp:maintenance:terminate"], timeout=1)
    gce.preempt(30)
    recorder.wait_for(lambda r: "gcp:termination:preempt" in r.ids, timeout=1)


def test_a_crashing_watcher_never_stops_the_loop(recorder, run_loop):
    """An unexpected exception in a watcher is logged and retried; later notices still arrive."""
    notice = Notice.create("aws", "termination", "terminate", terminal=True, grace=120)
    loop = run_loop([Scripted([RuntimeError("bug"), WatcherError("503"), [notice]])])
    assert loop.wait_terminal(3) is notice and loop.errors == 2


def test_a_failing_callback_never_stops_the_loop(run_loop):
    """A callback that raises does not stop delivery of the next notice."""
    rebalance = Notice.create("aws", "rebalance", "rebalance", terminal=False)
    terminate = Notice.create("aws", "termination", "terminate", terminal=True, grace=120)
    calls = []

    def callback(notice):
        calls.append(notice.id)
        if notice is rebalance:
            raise RuntimeError("callback bug")

    loop = WatchLoop([Scripted([[rebalance], [terminate]])], callback).start()
    try:
        assert loop.wait_terminal(3) is terminate and calls == [rebalance.id, terminate.id]
    finally:
        loop.stop()


def test_stop_ends_every_thread(imds):
    """stop() ends the watcher threads promptly."""
    loop = WatchLoop([aws(imds)], lambda n: None).start()
    time.sleep(0.1)
    loop.stop(timeout=1)
    assert not any(t.is_alive() for t in loop._threads)
    assert threading.active_count() < 50


def test_the_error_backoff_stays_at_its_cap_after_ten_thousand_failures():
    """A metadata server down for a day: the 1,025th failure in a row once overflowed the float and ended the
    watcher's thread; the wait stays at backoff_max (with its jitter) for any count."""
    loop = WatchLoop([Scripted([])], lambda n: None, backoff_initial=0.25, backoff_max=5.0)
    for failures in (1, 1_025, 10_000):
        delay = loop._backoff(failures)
        assert (0.2 <= delay <= 0.3) if failures == 1 else (4.0 <= delay <= 6.0)
