"""Two ranks under torchrun: count this process's threads before a Checkpointer is built and after its close().

``python release_trainee.py REPORT_PREFIX LOCAL_DIR DURABLE_URL``: each rank writes REPORT_PREFIX.<rank>.json.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

from runner.checkpoint import Checkpointer


def threads() -> list[str]:
    """Every thread of this process (C++ ones included, which ``threading`` does not see), by name."""
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as comm:
                names.append(comm.read().strip())
        except FileNotFoundError:  # ended while listed
            pass
    return sorted(names)


def main(report: str, local_dir: str, durable_url: str) -> None:
    dist.init_process_group("gloo")
    model = torch.nn.Linear(4, 4)
    before = threads()
    ckpt = Checkpointer(model=model, local_dir=local_dir, durable_url=durable_url, interval="1h")
    ckpt.restore()
    for step in (1, 2):
        ckpt.step(step)
    ckpt.save(2)
    saved = ckpt.wait(timeout=120)
    ckpt.close()
    after = threads()
    with open(f"{report}.{dist.get_rank()}.json", "w") as out:
        json.dump({"before": before, "after": after, "saved": saved}, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
