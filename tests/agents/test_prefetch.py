"""A new node fetches the job's checkpoint into its local tier while its setup runs (agents/prefetch.py):
the newest committed one, and one still being uploaded file by file, so that the restore reads local disk."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import torch
from torch import nn

from agents.prefetch import CheckpointPrefetch, local_checkpoint_root, resume_step, step_folder
from runner.checkpoint import Checkpointer
from runner.checkpoint.manifest import folder_name


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 4))


def _wait(predicate, timeout: float = 60.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.05)
    raise AssertionError("timed out")


def test_the_folder_naming_is_the_libraries():
    assert step_folder(1200) == folder_name(1200)


def test_a_committed_checkpoint_is_prefetched_and_restored_from_local_disk(tmp_path):
    durable = tmp_path / "durable"
    saved = _model(1)
    with Checkpointer(local_dir=tmp_path / "old-node", durable_url=f"file://{durable}", model=saved) as ckpt:
        ckpt.save(7)
        assert ckpt.wait(60)

    prefetch = CheckpointPrefetch(f"file://{durable}", tmp_path / "new-node").start()
    try:
        assert prefetch.wait_for(7, timeout=60)
    finally:
        prefetch.stop()
    local = tmp_path / "new-node" / folder_name(7)
    assert not (local / "manifest.json").exists()  # the restore commits it, once it verified every file
    # The durable tier loses its data files: only the manifest is left there, so the restore can only have
    # read the data from the local copy the prefetch made.
    for path in (durable / folder_name(7)).iterdir():
        if path.name != "manifest.json":
            path.unlink()
    restored = _model(2)
    with Checkpointer(local_dir=tmp_path / "new-node", durable_url=f"file://{durable}", model=restored) as ckpt:
        assert ckpt.restore() == 7
    assert all(torch.equal(a, b) for a, b in zip(saved.state_dict().values(), restored.state_dict().values()))


def test_a_checkpoint_being_uploaded_is_followed_file_by_file(tmp_path):
    """Each file is copied as soon as it is complete on the durable tier, before the manifest commits the
    checkpoint; the step counts as fetched only once the manifest is there and every file it lists is here."""
    source = tmp_path / "source"
    with Checkpointer(local_dir=source, model=_model(3)) as ckpt:
        ckpt.save(5)
        assert ckpt.wait(60)
    committed = source / folder_name(5)
    files = sorted(p.name for p in committed.iterdir() if p.name != "manifest.json")
    uploading = tmp_path / "durable" / folder_name(5)
    uploading.mkdir(parents=True)

    prefetch = CheckpointPrefetch(f"file://{tmp_path / 'durable'}", tmp_path / "new-node", poll_seconds=0.05).start()
    try:
        shutil.copy(committed / files[0], uploading / files[0])  # the first file is up, the rest still uploading
        _wait(lambda: (tmp_path / "new-node" / folder_name(5) / files[0]).is_file())
        assert not prefetch.wait_for(5, timeout=0.5)  # no manifest yet: not a checkpoint to resume from
        for name in files[1:]:
            shutil.copy(committed / name, uploading / name)
        shutil.copy(committed / "manifest.json", uploading / "manifest.json")  # the commit
        assert prefetch.wait_for(5, timeout=60)
    finally:
        prefetch.stop()
    for name in files:
        assert (tmp_path / "new-node" / folder_name(5) / name).read_bytes() == (committed / name).read_bytes()


def test_a_complete_checkpoint_is_kept_while_a_newer_upload_is_followed_and_is_handed_over_at_once(tmp_path):
    """The emergency checkpoint being uploaded may miss the reclaim: the controller then hands over the last
    committed step, which the follower fetched before. Following the newer upload must not delete it, and the
    handover must not wait for it again (it did, until the stall limit: 30 s, and the restore read it twice)."""
    source = tmp_path / "source"
    with Checkpointer(local_dir=source, model=_model(4)) as ckpt:
        ckpt.save(5)
        ckpt.save(9)
        assert ckpt.wait(60)
    durable = tmp_path / "durable"
    shutil.copytree(source / folder_name(5), durable / folder_name(5))
    prefetch = CheckpointPrefetch(f"file://{durable}", tmp_path / "new-node", poll_seconds=0.05).start()
    try:
        wanted = [p for p in (source / folder_name(5)).iterdir() if p.name != "manifest.json"]
        here = tmp_path / "new-node" / folder_name(5)
        _wait(lambda: all((here / p.name).is_file() for p in wanted))  # the newest, step 5, fetched
        newer = durable / folder_name(9)
        newer.mkdir()
        first = sorted(p.name for p in (source / folder_name(9)).iterdir() if p.name != "manifest.json")[0]
        shutil.copy(source / folder_name(9) / first, newer / first)  # the emergency upload, cut off by the reclaim
        _wait(lambda: (tmp_path / "new-node" / folder_name(9) / first).is_file())
        fetched = prefetch.fetched_bytes
        assert prefetch.wait_for(5, timeout=120)
        assert prefetch.fetched_bytes == fetched  # kept, not fetched again
    finally:
        prefetch.stop()
    for path in (source / folder_name(5)).iterdir():
        if path.name != "manifest.json":
            assert (tmp_path / "new-node" / folder_name(5) / path.name).read_bytes() == path.read_bytes()


def test_a_gang_checkpoint_with_a_hidden_file_in_its_manifest_is_fetched_whole(tmp_path):
    """A gang's checkpoint (torch.distributed.checkpoint's format) lists ``.metadata``: it is fetched once the
    manifest commits it, and the step is complete (it was never fetched, and the handover waited for the stall
    limit, 30 s, then the restore read it from the durable tier)."""
    import json

    committed = tmp_path / "durable" / folder_name(4)
    committed.mkdir(parents=True)
    files = {"__0_0.distcp": b"rank 0 shard", "__1_0.distcp": b"rank 1 shard", ".metadata": b"the plan"}
    for name, data in files.items():
        (committed / name).write_bytes(data)
    (committed / "manifest.json").write_text(json.dumps(
        {"step": 4, "files": [{"name": n, "bytes": len(d)} for n, d in files.items()]}))
    prefetch = CheckpointPrefetch(f"file://{tmp_path / 'durable'}", tmp_path / "new-node", poll_seconds=0.05).start()
    try:
        assert prefetch.wait_for(4, timeout=120)
    finally:
        prefetch.stop()
    for name, data in files.items():
        assert (tmp_path / "new-node" / folder_name(4) / name).read_bytes() == data


def test_a_step_the_durable_tier_lacks_is_not_waited_for(tmp_path):
    (tmp_path / "durable").mkdir()
    prefetch = CheckpointPrefetch(f"file://{tmp_path / 'durable'}", tmp_path / "new-node", poll_seconds=0.05).start()
    try:
        started = time.monotonic()
        assert not prefetch.wait_for(9, timeout=120)
        assert time.monotonic() - started < 60
    finally:
        prefetch.stop()


def test_what_the_assignment_says():
    assert resume_step({"checkpoint": {"resume": {"step": 40}}}) == 40
    assert resume_step({"checkpoint": {"resume": None}}) is None
    scratch = Path("/scratch")
    assert local_checkpoint_root({"checkpoint": {"local_dir": None}}, scratch) == scratch / "checkpoints"
    assert local_checkpoint_root({"checkpoint": {"local_dir": "ck"}}, scratch) == scratch / "work" / "ck"
    assert local_checkpoint_root({"checkpoint": {"local_dir": "/nvme/ck"}}, scratch) == Path("/nvme/ck")
