"""The restore reads a DCP checkpoint's tensors straight into the restored ones (runner/checkpoint/dcp_read.py):
what it loads is exactly what DCP's own reader loads, for every dtype and layout a state dict holds, and what it
cannot read directly still loads."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed.checkpoint as dcp

from runner.checkpoint import dcp_format, dcp_read
from runner.checkpoint.errors import CorruptCheckpointError


def _state() -> dict:
    torch.manual_seed(3)
    wide = torch.randn(6, 40)
    return {
        "weight": torch.randn(64, 33),
        "half": torch.randn(17, 5).to(torch.bfloat16),
        "steps": torch.arange(1000, dtype=torch.int64),
        "mask": torch.rand(31) > 0.5,
        "scalar": torch.tensor(2.5),
        "empty": torch.empty(0, 7),
        "slice_of_a_larger_storage": wide[2:5],  # saved with its whole storage and an offset into it
        "column_view": wide[:, 3],  # not contiguous: saved as its storage with strides
        "big": torch.randn(3, 1 << 20),
        "meta": {"lr": 0.1, "name": "adam"},  # not a tensor: DCP's own reader loads it
    }


def _empty_like(state: dict) -> dict:
    return {k: (torch.full_like(v, 0) if isinstance(v, torch.Tensor) else {"lr": 0.0, "name": ""})
            for k, v in state.items()}


def _load(folder, into: dict, direct: bool, monkeypatch) -> dict:
    monkeypatch.setattr(dcp_format, "READ_DIRECT", direct)
    dcp.load(into, storage_reader=dcp_format._reader(folder), planner=dcp_format._planner(), no_dist=True)
    return into


@pytest.fixture
def saved(tmp_path):
    state = _state()
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(tmp_path)), no_dist=True)
    return tmp_path, state


def test_every_dtype_and_layout_loads_exactly_as_dcps_own_reader_loads_it(saved, monkeypatch):
    folder, state = saved
    direct = _load(folder, _empty_like(state), True, monkeypatch)
    theirs = _load(folder, _empty_like(state), False, monkeypatch)
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            assert direct[key].dtype == value.dtype and torch.equal(direct[key], value), key
            assert torch.equal(direct[key], theirs[key]), key
    assert direct["meta"] == theirs["meta"] == {"lr": 0.1, "name": "adam"}


def test_targets_that_cannot_take_the_bytes_directly_get_them_converted_and_strided(saved, monkeypatch):
    folder, state = saved
    into = _empty_like(state)
    into["weight"] = torch.zeros(33, 64).t()  # a transposed view: not contiguous
    into["big"] = torch.zeros(3, 1 << 20, dtype=torch.float64)  # another dtype than the one stored
    loaded = _load(folder, into, True, monkeypatch)
    assert torch.equal(loaded["weight"], state["weight"])
    assert torch.equal(loaded["big"], state["big"].to(torch.float64))


def test_plain_tensors_are_read_directly_and_only_the_rest_goes_to_dcps_reader(saved):
    from torch.distributed.checkpoint.default_planner import create_default_local_load_plan

    folder, state = saved
    target = _empty_like(state)
    reader = dcp_format._reader(folder)
    metadata = reader.read_metadata()
    reader.set_up_storage_reader(metadata, is_coordinator=True)
    planner = dcp_format._planner()
    planner.set_up_planner(target, metadata, is_coordinator=True)
    plan = create_default_local_load_plan(planner.state_dict, metadata, not planner.allow_partial_load)
    per_file: dict[str, list] = {}
    for request in plan.items:
        per_file.setdefault(reader.storage_data[request.storage_index].relative_path, []).append(request)
    fallback: list = []
    for name, requests in per_file.items():
        dcp_read.read_tensors(str(folder / name), requests, reader.storage_data, planner, fallback)
    assert {r.dest_index.fqn for r in fallback} == {"meta.lr", "meta.name"}
    assert torch.equal(target["big"], state["big"]) and torch.equal(target["column_view"], state["column_view"])


def test_a_file_cut_short_after_its_check_is_a_damaged_checkpoint_naming_the_file(saved, monkeypatch):
    """The restore verified every file before the load; one that changes in between is found, not half-loaded."""
    folder, state = saved
    data = max(folder.glob("*.distcp"), key=lambda p: p.stat().st_size)
    os.truncate(data, data.stat().st_size - 4096)
    with pytest.raises(BaseException) as raised:  # DCP gathers every rank's error in one (a BaseException)
        _load(folder, _empty_like(state), True, monkeypatch)
    failure = dcp_format._rank_failure(raised.value)
    assert isinstance(failure, CorruptCheckpointError) and data.name in str(failure)
