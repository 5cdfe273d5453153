"""Bad input and faults: a full or unwritable disk keeps training going; a bad URL fails at construction."""

from __future__ import annotations

import pytest
import torch
from structlog.testing import capture_logs

from runner.checkpoint import CheckpointConfigError, Checkpointer


class Big:
    """State of a given size, to fill a small disk."""

    def __init__(self, kib: int) -> None:
        self.tensor = torch.ones(kib * 256)

    def state_dict(self):
        return {"t": self.tensor}

    def load_state_dict(self, state):
        self.tensor.copy_(state["t"])


def test_a_full_disk_keeps_the_previous_checkpoint_and_training(tmpfs):
    """ENOSPC on a real 2 MiB tmpfs: the save fails with a warning naming the folder; step 1 stays restorable."""
    small = Big(kib=1100)
    with capture_logs() as logs, Checkpointer(local_dir=tmpfs, keep=5, big=small) as ckpt:
        ckpt.save(1)
        assert ckpt.wait()
        small.tensor.fill_(2.0)
        ckpt.save(2)  # 1.1 MiB used + 1.1 MiB: does not fit in 2 MiB
        assert not ckpt.wait()
        ckpt.step(3)  # training goes on
        assert ckpt.restore() == 1
    text = str(logs)
    assert "checkpoint not saved" in text
    assert str(tmpfs) in text
    assert torch.equal(small.tensor, torch.ones(1100 * 256))
    assert sorted(p.name for p in tmpfs.iterdir()) == ["step-00000001"]


def test_an_unwritable_folder_warns_and_training_goes_on(setup, tmp_path):
    """A local_dir that cannot be created (a file is in the way) gives a warning, not an exception."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with capture_logs() as logs, setup.checkpointer(blocker / "ckpt") as ckpt:
        ckpt.save(1)
        assert not ckpt.wait()
        ckpt.step(2)
        assert ckpt.restore() == 0
    assert str(blocker) in str(logs)


def test_an_unknown_scheme_fails_at_construction(tmp_path):
    """durable_url='nosuch://x' is refused at once with the schemes one could use."""
    with pytest.raises(CheckpointConfigError, match="unknown scheme 'nosuch'.*s3://"):
        Checkpointer(local_dir=tmp_path, durable_url="nosuch://bucket/x")


def test_a_missing_driver_names_the_package_to_install(tmp_path):
    """A known scheme whose driver is not installed says which package to pip install."""
    pytest.importorskip("fsspec")
    try:
        import adlfs  # noqa: F401
        pytest.skip("adlfs is installed here")
    except ImportError:
        pass
    with pytest.raises(CheckpointConfigError, match="pip install adlfs"):
        Checkpointer(local_dir=tmp_path, durable_url="abfs://container/x")


def test_a_store_that_stops_answering_never_holds_up_training(s3_env, tmp_path, monkeypatch):
    """With the S3 endpoint stalled, saves still commit locally one after another, and a SIGTERM notice is
    served from the local copy: should_stop comes before the deadline and close() returns by it."""
    import os
    import signal
    import threading
    import time
    from urllib.parse import urlparse

    import boto3

    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fakes"))
    from tcp_proxy import StallingProxy

    upstream = urlparse(s3_env)
    boto3.client("s3", endpoint_url=s3_env).create_bucket(Bucket="stall")
    proxy = StallingProxy((upstream.hostname, upstream.port))
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    grace = 10.0
    monkeypatch.setenv("RUNNER_SIGNAL_GRACE_SECONDS", str(grace))
    state = Big(kib=256)
    try:
        ckpt = Checkpointer(local_dir=tmp_path / "local", durable_url="s3://stall/job", interval="1h", big=state)
        ckpt.save(1)
        assert ckpt.wait()  # the store answers: committed on both tiers
        proxy.stall()
        for step in (2, 3, 4):  # each save stages at once although the uploads hang
            saver = threading.Thread(target=ckpt.save, args=(step,))
            saver.start()
            saver.join(grace)
            assert not saver.is_alive(), f"save({step}) blocked on the stalled store"
        _wait_for(lambda: (tmp_path / "local" / "step-00000004" / "manifest.json").is_file())
        os.kill(os.getpid(), signal.SIGTERM)  # a notice: the library's handler records it
        noticed = time.time()
        ckpt.step(5)
        assert ckpt.should_stop
        assert time.time() < noticed + grace
        assert (tmp_path / "local" / "step-00000005" / "manifest.json").is_file()
        ckpt.close()
        assert time.time() < noticed + grace
    finally:
        proxy.close()


def _wait_for(condition, timeout: float = 120.0) -> None:
    """Poll an event (a file appearing) with a generous bound that only a hang reaches."""
    import time

    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "the condition never came true"
        time.sleep(0.02)


def test_a_full_local_disk_still_sends_checkpoints_to_the_durable_tier(tmpfs, tmp_path):
    """ENOSPC on the local tier: the checkpoint goes from memory to the durable tier and restores from there."""
    small = Big(kib=1100)
    durable = tmp_path / "durable"
    with capture_logs() as logs, Checkpointer(local_dir=tmpfs, durable_url=durable.as_uri(), keep=5,
                                              big=small) as ckpt:
        ckpt.save(1)
        assert ckpt.wait()
        small.tensor.fill_(2.0)
        ckpt.save(2)  # does not fit on the 2 MiB tmpfs beside step 1
        ckpt.wait()
    assert (durable / "step-00000002" / "manifest.json").is_file()
    assert "sending it to the durable tier directly" in str(logs)
    restored = Big(kib=1100)
    with Checkpointer(local_dir=tmp_path / "fresh", durable_url=durable.as_uri(), big=restored) as again:
        assert again.restore() == 2
    assert torch.equal(restored.tensor, torch.full((1100 * 256,), 2.0))


def test_a_local_disk_too_small_to_fetch_the_checkpoint_into_says_so_instead_of_starting_fresh(tmpfs, tmp_path):
    """ENOSPC while restore() fetches a good durable checkpoint onto a 2 MiB tmpfs: restore raises a RestoreError
    naming the folder, the cause and the fix, rather than starting the training over from step 0; the half-fetched
    file is removed (the space is given back) and the durable checkpoint is untouched."""
    from runner.checkpoint import RestoreError

    durable = tmp_path / "durable"
    saved = Big(kib=3000)
    saved.tensor.fill_(7.0)
    with Checkpointer(local_dir=tmp_path / "first", durable_url=durable.as_uri(), big=saved) as ckpt:
        ckpt.save(5)
    restored = Big(kib=3000)
    with Checkpointer(local_dir=tmpfs, durable_url=durable.as_uri(), big=restored) as ckpt:
        with pytest.raises(RestoreError) as raised:
            ckpt.restore()
    text = str(raised.value)
    assert "step 5" in text and str(tmpfs) in text and "No space left on device" in text
    assert "local_dir" in text  # the fix: free space there or point local_dir at a larger disk
    assert not (tmpfs / "step-00000005" / "data-00000.bin").exists()
    assert (durable / "step-00000005" / "manifest.json").is_file()
    with Checkpointer(local_dir=tmp_path / "roomy", durable_url=durable.as_uri(), big=restored) as ckpt:
        assert ckpt.restore() == 5
    assert torch.equal(restored.tensor, saved.tensor)


def test_a_full_local_disk_at_a_notice_still_makes_the_emergency_checkpoint_durable(tmpfs, tmp_path, monkeypatch):
    """ENOSPC on the local tier while a notice (SIGTERM) is served: the emergency checkpoint goes from memory to the
    durable tier, should_stop comes, and a fresh process restores that step from there."""
    import os
    import signal

    monkeypatch.setenv("RUNNER_SIGNAL_GRACE_SECONDS", "60")
    durable = tmp_path / "durable"
    state = Big(kib=1100)
    with capture_logs() as logs, Checkpointer(local_dir=tmpfs, durable_url=durable.as_uri(), interval="1h",
                                              big=state) as ckpt:
        ckpt.save(1)
        assert ckpt.wait()
        state.tensor.fill_(2.0)
        os.kill(os.getpid(), signal.SIGTERM)  # a notice: the library's handler records it
        ckpt.step(2)  # the emergency checkpoint: does not fit on the 2 MiB tmpfs beside step 1
        assert ckpt.should_stop
    assert "No space left on device" in str(logs)
    assert (durable / "step-00000002" / "manifest.json").is_file()
    restored = Big(kib=1100)
    with Checkpointer(local_dir=tmp_path / "fresh", durable_url=durable.as_uri(), big=restored) as again:
        assert again.restore() == 2
    assert torch.equal(restored.tensor, torch.full((1100 * 256,), 2.0))
