"""An emergency checkpoint's upload starts from the staged buffer, beside the local write (persist.py).

A short notice leaves time for the durable tier only: the local disk's write and fsync must not come first.
The tests hold the local write back and see the checkpoint committed on the durable tier meanwhile, both
tiers verified afterwards; an upload that fails mid-way leaves the previous checkpoint the newest.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import fsspec
import pytest
import torch
from fsspec.implementations.local import LocalFileSystem

from runner.checkpoint import persist
from runner.checkpoint.checksum import file_digest
from runner.checkpoint.durable import DurableTier
from runner.checkpoint.local import LocalTier
from runner.checkpoint.persist import Persister, SaveJob
from runner.checkpoint.staging import Stager

from .test_control import agent  # noqa: F401 - the fake agent on the control socket


class BlockedLocalWrite(persist.FlatFormat):
    """The local tier's write waits until the test lets it go (a slow disk)."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.writing = threading.Event()

    def write(self, job, folder):
        self.writing.set()
        assert self.go.wait(60), "the test never let the local write go"
        return super().write(job, folder)


class FailingStore(LocalFileSystem):
    """A local filesystem whose writes of one file name fail (a connection lost mid-upload)."""

    protocol = "failtest"
    fail_name = "state.pkl"

    def _check(self, path) -> None:
        if str(path).endswith(self.fail_name):
            raise ConnectionError("connection reset mid-upload")

    def _open(self, path, mode="rb", **kwargs):
        if "w" in mode:
            self._check(path)
        return super()._open(path, mode, **kwargs)

    def put_file(self, path1, path2, *args, **kwargs):
        self._check(path2)
        return super().put_file(path1, path2, *args, **kwargs)

    def pipe_file(self, path, value, *args, **kwargs):
        self._check(path)
        return super().pipe_file(path, value, *args, **kwargs)


fsspec.register_implementation("failtest", FailingStore, clobber=True)


def _staged(step: int):
    torch.manual_seed(step)
    state = {"step": step, "objects": {"w": torch.randn(256, 256)}, "extra": {}, "rng": None}
    return Stager(part_bytes=64 * 1024).stage(state)  # several parts, as a large state has


def _verify(manifest, folder_files) -> None:
    """Every file the manifest lists is there with its size and checksum."""
    for entry in manifest.files:
        path = folder_files(entry["name"])
        assert path.stat().st_size == entry["bytes"]
        assert file_digest(path, manifest.checksum) == entry["checksum"]


@pytest.fixture
def tiers(tmp_path: Path):
    return LocalTier(tmp_path / "local"), tmp_path / "bucket"


def test_an_emergency_checkpoint_is_durable_before_the_local_write_ends(tiers):
    local, bucket = tiers
    durable = DurableTier(f"file://{bucket}")
    fmt = BlockedLocalWrite()
    reports: list[tuple[str, int]] = []
    persister = Persister(local, durable, 3, lambda j: reports.append(("local", j.step)),
                          lambda j: reports.append(("durable", j.step)), fmt=fmt)
    job = SaveJob(42, _staged(42), emergency=True, attempt=1, job_id="job")
    persister.submit(job)
    assert fmt.writing.wait(30)
    assert job.durable_done.wait(30), "the emergency upload waited for the local write"
    assert job.durable_manifest is not None and durable.committed() == [42]
    assert not job.local_done.is_set() and not persister.buffer_free.is_set()  # the local write still reads it
    fmt.go.set()
    assert job.local_done.wait(30) and persister.buffer_free.wait(30)
    assert reports == [("durable", 42), ("local", 42)]
    _verify(durable.read_manifest(42), lambda name: bucket / "step-00000042" / name)
    (step, folder), = local.committed()
    assert step == 42
    _verify(local.read_manifest(folder), lambda name: folder / name)
    persister.stop()


def test_a_periodic_checkpoint_still_uploads_after_its_local_commit(tiers):
    local, bucket = tiers
    durable = DurableTier(f"file://{bucket}")
    fmt = BlockedLocalWrite()
    persister = Persister(local, durable, 3, lambda j: None, lambda j: None, fmt=fmt)
    job = SaveJob(7, _staged(7), emergency=False, attempt=1, job_id="job")
    persister.submit(job)
    assert fmt.writing.wait(30)
    assert not job.durable_done.wait(0.5) and durable.committed() == []
    fmt.go.set()
    assert job.durable_done.wait(30) and durable.committed() == [7]
    persister.stop()


def test_an_emergency_upload_that_fails_mid_way_leaves_the_previous_checkpoint_the_newest(tiers):
    local, bucket = tiers
    durable = DurableTier(f"failtest://{bucket}")
    FailingStore.fail_name = "never"
    failures: list[str] = []
    persister = Persister(local, durable, 3, lambda j: None, lambda j: None,
                          on_failed=lambda j, tier, error: failures.append(tier))
    first = SaveJob(10, _staged(10), emergency=False, attempt=1, job_id="job", seq=1)
    persister.submit(first)
    assert first.durable_done.wait(30) and durable.committed() == [10]
    FailingStore.fail_name = "state.pkl"  # the skeleton, uploaded after the data parts
    emergency = SaveJob(11, _staged(11), emergency=True, attempt=1, job_id="job", seq=2)
    persister.submit(emergency)
    assert emergency.durable_done.wait(30)
    assert emergency.durable_manifest is None and isinstance(emergency.durable_error, ConnectionError)
    assert durable.committed() == [10] and failures == ["durable"]
    assert emergency.local_done.wait(30) and [s for s, _ in local.committed()][0] == 11  # kept locally
    persister.stop()


def test_a_timing_checkpoint_is_uploaded_from_the_buffer_as_the_emergency_one_is(tiers):
    """A notice's timing checkpoint (training goes on) takes the emergency's path, so its time to durable is the
    emergency's: durable while the local write is still held back."""
    local, bucket = tiers
    durable = DurableTier(f"file://{bucket}")
    fmt = BlockedLocalWrite()
    persister = Persister(local, durable, 3, lambda j: None, lambda j: None, fmt=fmt)
    job = SaveJob(9, _staged(9), emergency=False, attempt=1, job_id="job", upload_from_buffer=True)
    persister.submit(job)
    assert fmt.writing.wait(30)
    assert job.durable_done.wait(30), "the timing checkpoint's upload waited for the local write"
    assert job.from_buffer and durable.committed() == [9] and not durable.read_manifest(9).emergency
    fmt.go.set()
    assert job.local_done.wait(30) and persister.buffer_free.wait(30)
    persister.stop()


class PriorityStore(LocalFileSystem):
    """A local filesystem that notes the scheduling priority (nice) of each thread writing a file to it."""

    protocol = "prioritytest"
    seen: list[int] = []

    def _open(self, path, mode="rb", **kwargs):
        if "w" in mode:
            PriorityStore.seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        return super()._open(path, mode, **kwargs)


fsspec.register_implementation("prioritytest", PriorityStore, clobber=True)


def test_the_upload_from_the_buffer_runs_at_the_priority_of_the_thread_that_saves(tiers):
    """The training waits for an emergency's upload: on a loaded node a niced upload (as the local write and a
    periodic upload are, so that training wins the CPU) lost to every other process and missed the deadline."""
    local, bucket = tiers
    durable = DurableTier(f"prioritytest://{bucket}")
    PriorityStore.seen.clear()
    persister = Persister(local, durable, 3, lambda j: None, lambda j: None)
    job = SaveJob(3, _staged(3), emergency=True, attempt=1, job_id="job")
    persister.submit(job)
    assert job.durable_done.wait(30) and job.durable_manifest is not None
    training = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert PriorityStore.seen and set(PriorityStore.seen) == {training}
    persister.stop()


def test_a_periodic_upload_abandoned_for_an_emergency_sends_no_further_file(tiers, tmp_path, monkeypatch):
    """On a tier held to one bandwidth per node, an abandoned upload that went on sending its files shared it
    with the emergency's: it stops at its next file, and the periodic step is left uncommitted."""
    from structlog.testing import capture_logs

    from runner.local_durable import throttle_environment

    for key, value in throttle_environment(2.0, tmp_path / "bandwidth").items():  # 2 MB/s
        monkeypatch.setenv(key, value)
    local, bucket = tiers
    durable = DurableTier(f"local-durable://{bucket}")
    torch.manual_seed(0)
    stager = Stager(part_bytes=256 * 1024)  # kept: the staged parts are views of its buffer
    big = stager.stage({"step": 5, "objects": {f"w{i}": torch.randn(256, 512) for i in range(8)}, "extra": {},
                        "rng": None})  # 4 MB in 8 files: 2 s at 2 MB/s
    with capture_logs() as logs:
        persister = Persister(local, durable, 3, lambda j: None, lambda j: None)
        periodic = SaveJob(5, big, emergency=False, attempt=1, job_id="job")
        persister.submit(periodic)
        assert periodic.local_done.wait(30) and persister.buffer_free.wait(30)
        folder = bucket / "step-00000005"
        while not (folder.is_dir() and any(not p.name.startswith(".") for p in folder.iterdir())):
            assert not periodic.durable_done.is_set(), "the periodic upload ended before the emergency came"
            threading.Event().wait(0.01)  # its first file is up: the upload is under way
        emergency = SaveJob(6, _staged(6), emergency=True, attempt=1, job_id="job")
        persister.submit(emergency)
        assert emergency.durable_done.wait(60) and emergency.durable_manifest is not None
        assert periodic.durable_done.wait(60) and periodic.durable_manifest is None  # abandoned
        abandoned = []
        for _ in range(6000):  # the abandoned upload's thread stops at its next file: an event, not a time
            abandoned = [entry for entry in logs if entry["event"].startswith("upload abandoned")]
            if abandoned:
                break
            threading.Event().wait(0.01)
    assert abandoned and abandoned[0]["not_sent"] > 0
    uploaded = [p for p in folder.iterdir() if not p.name.startswith(".")]
    assert len(uploaded) < len(big.parts) + 1 and durable.committed() == [6]
    persister.stop()


class Gate:
    """Lets the first file through, holds every later one until ``go`` (files may be sent in parallel)."""

    def __init__(self) -> None:
        self.first_file = threading.Event()
        self.go = threading.Event()
        self._lock = threading.Lock()
        self._passed = False

    def reset(self) -> None:
        with self._lock:
            self._passed = False
        self.first_file.clear()
        self.go.clear()

    def enter(self) -> bool:
        """True for the first file (let through); later ones wait here for ``go``."""
        with self._lock:
            first, self._passed = not self._passed, True
        if not first:
            assert self.go.wait(60), "the test never let the upload go"
        return first


class HeldUpload(LocalFileSystem):
    """A local filesystem whose uploads stop after their first file until the test lets them go (a slow store)."""

    protocol = "heldtest"
    gate = Gate()

    def put_file(self, path1, path2, *args, **kwargs):
        first = HeldUpload.gate.enter()
        result = super().put_file(path1, path2, *args, **kwargs)
        if first:
            HeldUpload.gate.first_file.set()
        return result


fsspec.register_implementation("heldtest", HeldUpload, clobber=True)


def test_the_local_folder_an_upload_reads_is_not_pruned_under_it(tiers):
    """A durable tier slower than the checkpoints come (keep 1 here): the next local commit must not prune the
    folder whose upload is under way, or that upload fails and no periodic checkpoint ever becomes durable."""
    local, bucket = tiers
    HeldUpload.gate.reset()
    durable = DurableTier(f"heldtest://{bucket}")
    persister = Persister(local, durable, 1, lambda j: None, lambda j: None)
    stagers = [Stager(part_bytes=64 * 1024) for _ in range(2)]  # kept: the parts are views of their buffers
    first = SaveJob(10, stagers[0].stage({"step": 10, "objects": {f"w{i}": torch.randn(64, 64) for i in range(4)},
                                           "extra": {}, "rng": None}), emergency=False, attempt=1, job_id="job")
    persister.submit(first)
    assert HeldUpload.gate.first_file.wait(30)  # its upload is under way, held after one file
    assert persister.buffer_free.wait(30)
    second = SaveJob(20, stagers[1].stage({"step": 20, "objects": {f"w{i}": torch.randn(64, 64) for i in range(4)},
                                            "extra": {}, "rng": None}), emergency=False, attempt=1, job_id="job")
    persister.submit(second)
    assert second.local_done.wait(30) and second.local_manifest is not None  # committed, then the prune
    assert [step for step, _ in local.committed()] == [20, 10]  # kept while its upload reads it
    HeldUpload.gate.go.set()
    assert first.durable_done.wait(30) and second.durable_done.wait(30)
    assert first.durable_error is None and first.durable_manifest is not None  # committed, not failed
    assert second.durable_manifest is not None and durable.committed()[0] == 20
    persister.stop()


class HeldWrites(LocalFileSystem):
    """A local filesystem whose file writes wait, after the first, until the test lets them go (a slow store)."""

    protocol = "heldwritetest"
    gate = Gate()

    def _open(self, path, mode="rb", **kwargs):
        if "w" in mode and not str(path).endswith("attempt-00000002"):
            if HeldWrites.gate.enter():
                HeldWrites.gate.first_file.set()
        return super()._open(path, mode, **kwargs)


fsspec.register_implementation("heldwritetest", HeldWrites, clobber=True)


def test_a_periodic_save_does_not_block_the_training_behind_a_timing_checkpoints_upload(setup, tmp_path, agent):
    """A timing checkpoint's upload reads the staged buffer until it ends; a periodic save due meanwhile would
    wait for that buffer, stalling the training for as long as the upload: it is deferred to the next due step."""
    HeldWrites.gate.reset()
    ckpt = setup.checkpointer(tmp_path / "ckpt", durable_url=f"heldwritetest://{tmp_path / 'durable'}",
                              every_steps=2)
    agent.wait_for("hello")
    agent.send({"op": "checkpoint", "reason": "notice", "deadline": None, "stop": False, "timing": True})
    trained = []

    def train() -> None:
        for step in range(1, 11):
            ckpt.step(step)  # the timing checkpoint at step 1 once its request is in; periodic ones at 2, 4, ...
            trained.append(step)
            if step == 1:
                assert HeldWrites.gate.first_file.wait(30)  # the timing checkpoint's upload is under way, held

    for _ in range(1000):  # the request reaches the library
        if ckpt._control_request is not None:
            break
        threading.Event().wait(0.01)
    thread = threading.Thread(target=train, daemon=True)
    thread.start()
    thread.join(60)
    try:
        assert trained == list(range(1, 11)), "a periodic save waited for the timing checkpoint's upload"
    finally:
        HeldWrites.gate.go.set()
    thread.join(60)
    assert ckpt.wait(60)
    durable = []
    for _ in range(6000):  # the library's durable commit message reaches the test's agent
        durable = [m for m in agent.messages if m["op"] == "committed" and m["durable"]]
        if durable:
            break
        threading.Event().wait(0.01)
    assert durable and durable[0]["step"] == 1 and durable[0]["from_buffer"] is True
    ckpt.close()
