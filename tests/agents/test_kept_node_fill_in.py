"""A kept gang node fetches the other nodes' share of the stop's checkpoint as they upload it (agents/prefetch.py's
LocalFillIn), so the next attempt's restore reads the whole checkpoint from local disk.

The layout is a gang's (torch.distributed.checkpoint's): each node's local folder holds its own ranks' files and a
manifest naming every node's; the durable tier gets each node's files as that node uploads them."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from agents import prefetch as prefetch_module
from agents.prefetch import LocalFillIn
from runner.checkpoint.manifest import folder_name

STEP = 12
FILES = {"__0_0.distcp": b"rank 0's shard" * 100, "__1_0.distcp": b"rank 1's shard" * 100, ".metadata": b"the plan"}
OWN = "__0_0.distcp"  # this (kept) node's rank wrote it


def _wait(predicate, timeout: float = 120.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("timed out")


def _manifest() -> str:
    return json.dumps({"step": STEP, "files": [{"name": n, "bytes": len(d)} for n, d in FILES.items()]})


def _passes(fill_in: LocalFillIn, more: int) -> None:
    """Wait until the follower has looked at the durable tier ``more`` more times."""
    start = fill_in._passes
    _wait(lambda: fill_in._passes >= start + more)


def test_the_other_nodes_files_are_fetched_as_uploaded_and_this_nodes_own_are_never_touched(tmp_path):
    durable = tmp_path / "durable" / folder_name(STEP)
    durable.mkdir(parents=True)
    here = tmp_path / "kept-node" / folder_name(STEP)
    here.mkdir(parents=True)
    (here / OWN).write_bytes(FILES[OWN])  # this node's ranks are writing their share locally
    own_inode = (here / OWN).stat().st_ino
    (durable / OWN).write_bytes(b"x" * len(FILES[OWN]))  # this node's own upload (other bytes: never copied back)
    (durable / "__1_0.distcp").write_bytes(FILES["__1_0.distcp"])  # the other node's, already whole

    fill_in = LocalFillIn(f"file://{tmp_path / 'durable'}", tmp_path / "kept-node", poll_seconds=0.02,
                          target=STEP).start()
    try:
        # Nothing is written before this node's share is committed here (its manifest, written last).
        _passes(fill_in, 3)
        assert sorted(p.name for p in here.iterdir()) == [OWN]
        (here / "manifest.json").write_text(_manifest())  # the local commit
        _wait(lambda: (here / "__1_0.distcp").is_file())
        # A file not yet whole on the durable tier (its size is not the manifest's) is not taken.
        (durable / ".metadata").write_bytes(FILES[".metadata"][:3])
        _passes(fill_in, 3)
        assert not (here / ".metadata").exists()
        assert not fill_in.wait_for(STEP, timeout=0.3)  # the step is not whole here yet
        (durable / ".metadata").write_bytes(FILES[".metadata"])
        (durable / "manifest.json").write_text(_manifest())  # the durable commit
        assert fill_in.wait_for(STEP, timeout=120)
    finally:
        fill_in.stop()
    for name, data in FILES.items():
        assert (here / name).read_bytes() == data, name
    assert (here / OWN).stat().st_ino == own_inode  # this node's own file: never replaced
    assert fill_in.fetched_bytes == len(FILES["__1_0.distcp"]) + len(FILES[".metadata"])
    assert not [p.name for p in here.iterdir() if p.name.endswith(".prefetch")]


def test_a_step_never_committed_here_is_given_up_at_once_not_after_the_stall_limit(tmp_path, monkeypatch):
    """This node's share of the step never committed locally (its local write failed): the restore fetches what it
    needs. The handover must not wait for the follower's stall limit."""
    monkeypatch.setattr(prefetch_module, "STALL_SECONDS", 10_000.0)
    durable = tmp_path / "durable" / folder_name(STEP)
    durable.mkdir(parents=True)
    for name, data in FILES.items():
        (durable / name).write_bytes(data)
    (durable / "manifest.json").write_text(_manifest())
    (tmp_path / "kept-node").mkdir()
    fill_in = LocalFillIn(f"file://{tmp_path / 'durable'}", tmp_path / "kept-node", poll_seconds=0.02,
                          target=STEP).start()
    try:
        timeout = 600.0
        started = time.monotonic()
        assert not fill_in.wait_for(STEP, timeout=timeout)
        assert time.monotonic() - started < timeout  # given up, not timed out
    finally:
        fill_in.stop()
    assert not (tmp_path / "kept-node" / folder_name(STEP)).exists()  # nothing made here
    assert fill_in.fetched_bytes == 0


@pytest.mark.parametrize("resumed", ["the same step", "an older step"])
def test_the_handover_may_name_another_step_which_is_followed_instead(tmp_path, resumed):
    """The stop's checkpoint may miss the durable tier (the node on notice was reclaimed mid-upload): the controller
    then hands over an older step. The follower fetches the other nodes' share of that one, if this node has
    its own share committed."""
    older = STEP - 5
    for step in (older, STEP):
        folder = tmp_path / "durable" / folder_name(step)
        folder.mkdir(parents=True)
        for name, data in FILES.items():
            (folder / name).write_bytes(data)
        (folder / "manifest.json").write_text(_manifest())
        here = tmp_path / "kept-node" / folder_name(step)
        here.mkdir(parents=True)
        (here / OWN).write_bytes(FILES[OWN])
        (here / "manifest.json").write_text(_manifest())
    os.remove(tmp_path / "durable" / folder_name(STEP) / "manifest.json")  # the stop's step: never committed there
    wanted = STEP if resumed == "the same step" else older
    fill_in = LocalFillIn(f"file://{tmp_path / 'durable'}", Path(tmp_path / "kept-node"), poll_seconds=0.02,
                          target=STEP).start()
    try:
        assert fill_in.wait_for(wanted, timeout=120)
    finally:
        fill_in.stop()
    for name, data in FILES.items():
        assert (tmp_path / "kept-node" / folder_name(wanted) / name).read_bytes() == data


def test_a_file_that_cannot_be_written_whole_leaves_nothing_behind(tmp_path, monkeypatch):
    """A full disk (or a store gone mid-file) while a file is fetched: the half-written copy is removed, so the next
    try starts afresh and nothing takes the node's disk for good."""
    durable = tmp_path / "durable" / folder_name(STEP)
    durable.mkdir(parents=True)
    (durable / "__1_0.distcp").write_bytes(FILES["__1_0.distcp"])
    here = tmp_path / "kept-node" / folder_name(STEP)
    here.mkdir(parents=True)
    (here / OWN).write_bytes(FILES[OWN])
    (here / "manifest.json").write_text(_manifest())
    fill_in = LocalFillIn(f"file://{tmp_path / 'durable'}", tmp_path / "kept-node", target=STEP)

    def disk_full(source, target, **kwargs):
        Path(target).write_bytes(b"half a fi")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fill_in.fs, "get_file", disk_full)
    with pytest.raises(OSError, match="No space left"):
        fill_in._follow_newest()
    assert sorted(p.name for p in here.iterdir()) == sorted([OWN, "manifest.json"])
    assert fill_in.fetched_bytes == 0
