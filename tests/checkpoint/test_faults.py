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
