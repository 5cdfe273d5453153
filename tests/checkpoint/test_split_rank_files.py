"""A rank's share of a large checkpoint is written as several files, so that a reader of the durable tier (a gang's
replacement prefetching the stop's checkpoint, a kept node's fill-in) can fetch each as soon as it is uploaded instead
of waiting for the rank's whole share; a small share stays one file, and either reads back exactly."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from runner.checkpoint import dcp_format
from runner.checkpoint.group import GlooComm


def _model(megabytes: int, tensors: int) -> nn.Module:
    model = nn.Linear(4, 2)
    for i in range(tensors):
        model.register_buffer(f"ballast{i}", torch.rand(megabytes * 1024 * 1024 // 4 // tensors))
    return model


def _roundtrip(tmp_path, monkeypatch, megabytes: int, tensors: int, file_bytes: int) -> list[str]:
    """Write a 1-rank DCP checkpoint of such a model into a folder, read it into a fresh model; the data files."""
    monkeypatch.setattr(dcp_format, "FILE_BYTES", file_bytes)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        comm = GlooComm(dist.new_group(backend="gloo"), 0, 1)
        torch.manual_seed(0)
        saved = _model(megabytes, tensors)
        folder = tmp_path / "step"
        state = dcp_format.capture({"model": saved}, {}, rank=0)
        written = dcp_format.write(state, folder, comm)
        torch.manual_seed(1)
        loaded = _model(megabytes, tensors)
        dcp_format.load(folder, {"model": loaded}, {}, comm, saved_world=1)
        for name, value in saved.state_dict().items():
            assert torch.equal(value, loaded.state_dict()[name]), name
        names = sorted(f["name"] for f in written if f["name"] != dcp_format.METADATA_NAME)
        assert names == sorted(p.name for p in folder.glob("*.distcp"))  # every file written is listed for upload
        return names
    finally:
        dist.destroy_process_group()


def test_a_large_share_is_written_as_several_files_and_read_back_exactly(tmp_path, monkeypatch):
    # 12 MB in eight tensors, files of about 4 MB: three files, the tensors spread over them by size
    names = _roundtrip(tmp_path, monkeypatch, megabytes=12, tensors=8, file_bytes=4 * 1024 * 1024)
    assert names == ["__0_0.distcp", "__0_1.distcp", "__0_2.distcp"]
    sizes = [(tmp_path / "step" / n).stat().st_size for n in names]
    assert max(sizes) < 2 * min(sizes)  # balanced: no file holds most of the share


def test_a_small_share_stays_one_file(tmp_path, monkeypatch):
    assert _roundtrip(tmp_path, monkeypatch, megabytes=2, tensors=8, file_bytes=4 * 1024 * 1024) == ["__0_0.distcp"]


def test_never_more_files_than_tensors_nor_an_empty_one(tmp_path, monkeypatch):
    # 8 MB in two tensors with files of 1 MB: two files, not eight (a tensor is never split)
    names = _roundtrip(tmp_path, monkeypatch, megabytes=8, tensors=2, file_bytes=1024 * 1024)
    assert names == ["__0_0.distcp", "__0_1.distcp"]
    assert all((tmp_path / "step" / n).stat().st_size > 0 for n in names)
