"""A process group's checkpoint that the local disk cannot hold: DCP reports the failure of its write as a
``CheckpointException``, which is a ``BaseException``. It is one checkpoint not saved, said so, and the next one
(with room again) commits on both tiers: the persister's writer goes on."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from runner.checkpoint import dcp_format
from runner.checkpoint.durable import DurableTier
from runner.checkpoint.group import GlooComm
from runner.checkpoint.local import LocalTier
from runner.checkpoint.manifest import MANIFEST_NAME, folder_name
from runner.checkpoint.persist import DcpFormat, Persister, SaveJob


@pytest.fixture
def group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield GlooComm(dist.new_group(backend="gloo"), 0, 1), GlooComm(dist.new_group(backend="gloo"), 0, 1)
    finally:
        dist.destroy_process_group()


def _model(megabytes: float) -> nn.Module:
    model = nn.Linear(4, 2)
    model.register_buffer("ballast", torch.rand(int(megabytes * 1024 * 1024 / 4)))
    return model


@pytest.mark.parametrize("emergency", [False, True], ids=["periodic", "emergency"])
def test_a_checkpoint_too_large_for_the_disk_fails_alone_and_the_next_one_commits(tmpfs, tmp_path, group, emergency):
    writer, uploader = group
    local, durable = LocalTier(tmpfs / "checkpoints"), DurableTier(f"file://{tmp_path / 'bucket'}")
    failures = []
    persister = Persister(local, durable, 3, lambda job: None, lambda job: None, writer=writer, uploader=uploader,
                          fmt=DcpFormat(writer), on_failed=lambda job, tier, error: failures.append((job.step, tier)))
    jobs = []
    for step, megabytes in ((1, 8), (2, 0.25)):  # 8 MB cannot fit the 2 MiB disk; a quarter of one can
        staged = dcp_format.Stager().stage(dcp_format.capture({"model": _model(megabytes)}, {}, rank=0))
        job = SaveJob(step, staged, emergency, None, None, seq=step)
        persister.submit(job)
        assert job.durable_done.wait(120), f"step {step} never settled"
        jobs.append(job)
    persister.stop()
    too_large, small = jobs
    assert too_large.error is not None and too_large.durable_manifest is None
    assert (1, "local") in failures
    assert not (tmp_path / "bucket" / folder_name(1) / MANIFEST_NAME).exists()
    assert small.error is None and small.durable_manifest is not None
    assert (local.folder(2) / MANIFEST_NAME).exists() and durable.committed() == [2]
