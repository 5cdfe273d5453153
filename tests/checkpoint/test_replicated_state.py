"""Whether a gang's checkpoint is replicated (every rank holds the whole state, so each rank's restore reads every
file) is what lets a kept node fetch the other nodes' share ahead: a sharded state must never count as one."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from runner.checkpoint.dcp_format import replicated


def test_a_ddp_state_is_replicated_and_a_sharded_one_is_not(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor

        model = nn.parallel.DistributedDataParallel(nn.Linear(4, 2))
        plain = {"model": model.module.state_dict(), "optimizer": {"state": {0: {"step": torch.tensor(1.0)}}},
                 "__runner__.rank0": b"blob"}
        assert replicated(plain)
        mesh = init_device_mesh("cpu", (1,))
        sharded = {**plain, "fsdp": {"weight": distribute_tensor(torch.zeros(4, 2), mesh, [Shard(0)])}}
        assert not replicated(sharded)
        # A DTensor placed as replicated is still counted as sharded: when in doubt, nothing is fetched ahead.
        assert not replicated({"tp": [distribute_tensor(torch.zeros(2), mesh, [Replicate()])]})
    finally:
        dist.destroy_process_group()
