"""close() is bounded when the durable tier hangs, and names what it gave up on (a real fsspec filesystem that
blocks, registered as hangtest://)."""

from __future__ import annotations

import threading
import time

import pytest
from structlog.testing import capture_logs

from .hanging_store import HangingStore

WATCHDOG_S = 90.0  # far beyond the bounds under test: a close() still blocked then would block for ever


@pytest.fixture
def store():
    HangingStore.reset()
    yield HangingStore
    HangingStore.release()  # let every blocked thread go
    HangingStore.reset()


def _close_within_watchdog(ckpt, **kwargs) -> float:
    """Run close() on this (the main) thread; a watchdog releases the store if close() is still blocked after
    WATCHDOG_S, so the test fails instead of hanging."""
    fired = threading.Event()

    def watchdog() -> None:
        fired.set()
        HangingStore.release()

    timer = threading.Timer(WATCHDOG_S, watchdog)
    timer.start()
    started = time.monotonic()
    try:
        ckpt.close(**kwargs)
    finally:
        timer.cancel()
    assert not fired.is_set(), f"close() was still blocked after {WATCHDOG_S:.0f} s on a hung durable tier"
    return time.monotonic() - started


def test_close_with_nothing_pending_returns_although_the_store_hangs(setup, tmp_path, store):
    """The checkpoint committed on both tiers, then the store stopped answering (retention's listing hangs):
    nothing is left to upload, so close() returns and reports nothing abandoned."""
    ckpt = setup.checkpointer(tmp_path / "local", durable_url="hangtest://bucket/job", keep=1)
    store.hang_after_manifest()
    with capture_logs() as logs:
        ckpt.save(1)
        assert ckpt.wait(timeout=WATCHDOG_S), "the commit itself must be announced, whatever retention does"
        assert store.blocked.wait(WATCHDOG_S)
        _close_within_watchdog(ckpt)
    assert not [e for e in logs if "gave up" in e["event"]]


def test_close_gives_up_on_a_hung_upload_and_names_it(setup, tmp_path, store):
    """An upload hangs: close(timeout=1) returns, and one warning names the step, its files, and the local copy
    that is kept (which restores)."""
    ckpt = setup.checkpointer(tmp_path / "local", durable_url="hangtest://bucket/job")
    ckpt.save(1)
    assert ckpt.wait(timeout=WATCHDOG_S)
    store.hang()
    setup.train(2)
    with capture_logs() as logs:
        ckpt.save(3)
        assert store.blocked.wait(WATCHDOG_S)
        _close_within_watchdog(ckpt, timeout=1)
    gave_up = [e for e in logs if e["event"].startswith("close() gave up")]
    assert len(gave_up) == 1, logs
    entry = gave_up[0]
    assert entry["step"] == 3 and entry["local_committed"] is True
    assert "state.pkl" in entry["files"]
    assert entry["local"] == str(tmp_path / "local" / "step-00000003")
    assert "local copy is kept" in entry["event"]
    store.release()
    restored = setup.checkpointer(tmp_path / "local")  # no durable tier: the local copy alone
    assert restored.restore() == 3
    restored.close()


def test_close_timeout_is_checked(setup, tmp_path):
    ckpt = setup.checkpointer(tmp_path / "local")
    with pytest.raises(ValueError, match="timeout=-1"):
        ckpt.close(timeout=-1)
    ckpt.close()


EXITING = """
import sys
sys.path.insert(0, {tests!r})
import torch
from checkpoint.hanging_store import HangingStore
from runner.checkpoint import Checkpointer

model = torch.nn.Linear(4, 1)
ckpt = Checkpointer(model=model, local_dir={local!r}, durable_url="hangtest://bucket/job")
ckpt.save(1)
assert ckpt.wait(timeout=60)
HangingStore.hang_uploads()
ckpt.save(2)
assert HangingStore.blocked.wait(60)
ckpt.close(timeout=1)
print("close returned", flush=True)
"""


def test_the_process_exits_after_close_gave_up_on_a_hung_upload_naming_what_it_abandons(tmp_path):
    """close() gave up on an upload the store never answers: the process still exits (the upload's threads do not
    hold up the interpreter's exit), and says which transfer it abandoned."""
    import subprocess
    import sys
    from pathlib import Path

    tests = Path(__file__).resolve().parent.parent
    script = EXITING.format(tests=str(tests), local=str(tmp_path / "local"))
    try:
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=WATCHDOG_S)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the process did not exit within {WATCHDOG_S:.0f} s after close(): {exc.stdout!r} {exc.stderr!r}")
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "close returned" in output, output
    assert "still under way; they are abandoned" in output and "step-00000002" in output, output
