"""A process group's emergency checkpoint goes up file by file as its local write closes each (early_upload.py).

Its files reach the durable tier while the local write, its checksums and the local commit are still under way;
the durable tier's commit is then the same as any checkpoint's (manifest last, with the local commit's checksums),
and reads back exactly. A periodic checkpoint keeps the usual order (local commit, then upload); a superseded
attempt sends nothing; a file that fails to go up leaves the step uncommitted on the durable tier and the local
copy committed.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import fsspec
import pytest
import torch
import torch.distributed as dist
from fsspec.implementations.local import LocalFileSystem
from torch import nn

from runner.checkpoint import dcp_format
from runner.checkpoint.checksum import file_digest
from runner.checkpoint.durable import DurableTier
from runner.checkpoint.errors import SupersededError
from runner.checkpoint.group import GlooComm
from runner.checkpoint.local import LocalTier
from runner.checkpoint.manifest import MANIFEST_NAME, folder_name
from runner.checkpoint.persist import DcpFormat, Persister, SaveJob
from polling import eventually

STEP = 7


class FailingStore(LocalFileSystem):
    """A local filesystem whose upload of one file fails (a connection lost mid-upload)."""

    protocol = "earlyfailtest"
    fail_name = "__0_1.distcp"

    def put_file(self, path1, path2, *args, **kwargs):
        if str(path2).endswith(self.fail_name):
            raise ConnectionError("connection reset mid-upload")
        return super().put_file(path1, path2, *args, **kwargs)


fsspec.register_implementation("earlyfailtest", FailingStore, clobber=True)


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Linear(4, 2)
    for i in range(8):  # 8 MB in eight tensors: several files of about 1 MB (FILE_BYTES below)
        model.register_buffer(f"ballast{i}", torch.rand(256 * 1024))
    return model


@pytest.fixture
def group(tmp_path, monkeypatch):
    """A process group of one (gloo): the writer's and the uploader's side groups."""
    monkeypatch.setattr(dcp_format, "FILE_BYTES", 1024 * 1024)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield GlooComm(dist.new_group(backend="gloo"), 0, 1), GlooComm(dist.new_group(backend="gloo"), 0, 1)
    finally:
        dist.destroy_process_group()


def _persister(tmp_path: Path, group, url: str, on_commit=None) -> tuple[Persister, LocalTier, DurableTier]:
    writer, uploader = group
    local, durable = LocalTier(tmp_path / "local"), DurableTier(url)
    if on_commit is not None:
        commit = local.commit

        def committing(folder, manifest):
            on_commit(folder)
            return commit(folder, manifest)

        local.commit = committing
    persister = Persister(local, durable, 3, lambda job: None, lambda job: None, writer=writer, uploader=uploader,
                          fmt=DcpFormat(writer))
    return persister, local, durable


def _save(persister: Persister, model: nn.Module, emergency: bool = True, timing: bool = False,
          attempt: int | None = None) -> SaveJob:
    staged = dcp_format.Stager().stage(dcp_format.capture({"model": model}, {}, rank=0))
    job = SaveJob(STEP, staged, emergency, attempt, "job-1" if attempt else None, seq=1, upload_from_buffer=timing)
    persister.submit(job)
    assert job.durable_done.wait(120), "the checkpoint never settled on the durable tier"
    return job


def _data_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.distcp")) if folder.exists() else []


def _arrives(check, timeout: float) -> bool:
    """Whether ``check()`` holds within ``timeout`` (a bound, not an expectation); never raises (it runs inside the
    persister's writer thread)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.mark.parametrize("emergency, timing", [(True, False), (False, True)], ids=["emergency", "timing"])
def test_the_files_reach_the_durable_tier_before_the_local_commit_and_read_back_exactly(tmp_path, group, emergency,
                                                                                      timing):
    bucket = tmp_path / "bucket"
    durable_step = bucket / folder_name(STEP)
    up_before_commit = []

    def on_commit(folder):  # bounded: with no early upload, nothing of the step is on the durable tier yet
        up_before_commit.append(_arrives(lambda: _data_files(durable_step), timeout=30))

    persister, local, durable = _persister(tmp_path, group, f"file://{bucket}", on_commit)
    saved = _model(0)
    job = _save(persister, saved, emergency=emergency, timing=timing)
    persister.stop()
    assert up_before_commit == [True]
    assert job.durable_error is None and job.durable_manifest is not None
    manifest = durable.read_manifest(STEP)
    assert manifest.to_json() == local.read_manifest(local.folder(STEP)).to_json()
    assert len([f for f in manifest.files if f["name"].endswith(".distcp")]) > 1
    for entry in manifest.files:  # every file of the durable tier is the one the local commit checksummed
        assert file_digest(durable_step / entry["name"], manifest.checksum) == entry["checksum"], entry["name"]
    loaded = _model(1)
    dcp_format.load(durable_step, {"model": loaded}, {}, group[0], saved_world=1)
    for name, value in saved.state_dict().items():
        assert torch.equal(value, loaded.state_dict()[name]), name


def test_a_periodic_checkpoint_goes_up_after_its_local_commit(tmp_path, group):
    bucket = tmp_path / "bucket"
    up_at_commit = []
    persister, _, durable = _persister(tmp_path, group, f"file://{bucket}",
                                       lambda folder: up_at_commit.append(_data_files(bucket / folder_name(STEP))))
    job = _save(persister, _model(0), emergency=False)
    persister.stop()
    assert up_at_commit == [[]]
    assert job.durable_error is None and durable.committed() == [STEP]


def test_a_superseded_attempt_sends_no_file_of_its_emergency_checkpoint(tmp_path, group):
    bucket = tmp_path / "bucket"
    persister, local, durable = _persister(tmp_path, group, f"file://{bucket}")
    durable.mark_attempt(2, "job-1")  # attempt 2 of the job has started
    job = _save(persister, _model(0), attempt=1)
    persister.stop()
    assert isinstance(job.durable_error, SupersededError)
    assert _data_files(bucket / folder_name(STEP)) == []
    assert (local.folder(STEP) / MANIFEST_NAME).exists()  # its local copy is kept


def test_a_file_that_fails_to_go_up_leaves_the_step_uncommitted_there_and_committed_locally(tmp_path, group):
    bucket = tmp_path / "bucket"
    persister, local, durable = _persister(tmp_path, group, f"earlyfailtest://{bucket}")
    job = _save(persister, _model(0))
    persister.stop()
    assert isinstance(job.durable_error, ConnectionError)
    assert durable.committed() == []
    assert not (bucket / folder_name(STEP) / MANIFEST_NAME).exists()
    assert (local.folder(STEP) / MANIFEST_NAME).exists()


def test_an_early_upload_ends_its_threads_whatever_the_outcome(tmp_path, group):
    before = {t.ident for t in threading.enumerate()}
    persister, _, _ = _persister(tmp_path, group, f"earlyfailtest://{tmp_path / 'bucket'}")
    _save(persister, _model(0))
    persister.stop()
    eventually(lambda: not [t for t in threading.enumerate() if t.ident not in before and "early" in t.name],
               "the early upload's threads to end", timeout=30)
