"""A replicated state (DDP: every rank holds all of it) is staged only in the part each rank writes, not whole on
every rank: the host memory and the device copies of a save are a rank's share. The parts cover the state once,
the checkpoint reads back exactly, on the same ranks and on another number of them."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from runner.checkpoint import dcp_format
from runner.checkpoint.dcp_format import SMALL_REPLICATED_BYTES, owned_part
from runner.checkpoint.group import GlooComm

MB = 1024 * 1024


def _state() -> dict:
    """A model's and an optimizer's nest as the library captures it: large and small tensors, non-tensors."""
    return {"model": {f"layer{i}.weight": torch.full((int((i + 1) * MB / 4),), float(i)) for i in range(6)}
            | {"layer0.bias": torch.zeros(8)},
            "optimizer": {"state": {"layer5.weight": {"exp_avg": torch.ones(int(3 * MB / 4)),
                                                      "step": torch.tensor(3.0)}},
                          "param_groups": [{"lr": 0.1, "params": ["layer5.weight"]}]},
            "__runner__.rank0": b"blob"}


def _paths(node: dict, path=()) -> set:
    out = set()
    for key, value in node.items():
        if isinstance(value, torch.Tensor):
            out.add(path + (key,))
        elif isinstance(value, dict):
            out |= _paths(value, path + (key,))
    return out


def _bytes(node: dict) -> int:
    return sum(t.numel() * t.element_size() for t in dcp_format._tensors(node))  # noqa: SLF001


def test_the_ranks_parts_cover_the_state_once_balanced_with_the_small_tensors_on_rank_0():
    state = _state()
    everything = _paths(state)
    assert owned_part(state, 0, 1) is state
    for world in (2, 3, 4):
        parts = [owned_part(state, rank, world) for rank in range(world)]
        owned = [_paths(part) for part in parts]
        assert set().union(*owned) == everything
        assert sum(len(paths) for paths in owned) == len(everything)  # each tensor on one rank only
        small = {p for p in everything if _bytes({"t": _get(state, p)}) < SMALL_REPLICATED_BYTES}
        assert small <= owned[0]
        loads = [_bytes(part) for part in parts]
        assert max(loads) - min(loads) <= 6 * MB  # greedy by size: within the largest tensor
        for part in parts:  # what is not a tensor stays on every rank
            assert part["optimizer"]["param_groups"] == state["optimizer"]["param_groups"]
            assert part["__runner__.rank0"] == b"blob"
    assert _paths(owned_part(state, 1, 3)) == _paths(owned_part(_state(), 1, 3))  # the same layout, the same part


def _get(node: dict, path: tuple):
    for key in path:
        node = node[key]
    return node


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(512, 512), nn.Linear(512, 512), nn.Linear(512, 8))
    model.register_buffer("ballast", torch.rand(int(2 * MB / 4)))
    return model


def _rank(rank: int, world: int, folder: str, store: str, results) -> None:
    folder = Path(folder)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        comm = GlooComm(dist.new_group(backend="gloo"), rank, world)
        model = _model(0)
        state = dcp_format.capture({"model": model}, {}, rank)
        staged = dcp_format.Stager(ranks=lambda: (rank, world)).stage(state)
        dcp_format.write(staged, folder, comm)
        fresh = _model(1)
        dcp_format.load(folder, {"model": fresh}, {}, comm, saved_world=world)
        same = all(torch.equal(v, fresh.state_dict()[k]) for k, v in model.state_dict().items())
        results.put((rank, _bytes(staged), _bytes(state), same))
    finally:
        dist.destroy_process_group()


def test_two_ranks_stage_half_each_and_the_checkpoint_reads_back_exactly_on_two_ranks_and_on_one(tmp_path):
    world, folder = 2, tmp_path / "step"
    context = mp.get_context("spawn")
    results = context.Queue()
    processes = [context.Process(target=_rank, args=(rank, world, str(folder), str(tmp_path / "store"), results))
                 for rank in range(world)]
    for process in processes:
        process.start()
    got = [results.get(timeout=300) for _ in processes]
    for process in processes:
        process.join(60)
        assert process.exitcode == 0
    whole = got[0][2]
    for rank, staged, _, same in got:
        assert same, f"rank {rank} did not read the checkpoint back exactly"
        assert staged < 0.7 * whole, (rank, staged, whole)  # its share, not the whole state
    assert sum(staged for _, staged, _, _ in got) == whole
    # One rank (a gang that shrank to one node) reads all of it.
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store1'}", rank=0, world_size=1)
    try:
        fresh, saved = _model(1), _model(0)
        dcp_format.load(folder, {"model": fresh}, {}, GlooComm(dist.new_group(backend="gloo"), 0, 1), saved_world=2)
        for name, value in saved.state_dict().items():
            assert torch.equal(value, fresh.state_dict()[name]), name
    finally:
        dist.destroy_process_group()
