"""close() leaves no thread of the library behind in a torch.distributed job (2 gloo ranks under torchrun).

The library's gloo side groups have worker threads that live as long as the groups. Left to interpreter
shutdown, one of them can free a tensor after Python is gone and abort a process that had stopped cleanly
("terminate called without an active exception"), even when the script called
``dist.destroy_process_group()``; a stopped job then looks crashed. close() destroys them.
"""

from __future__ import annotations

import json
from pathlib import Path

from .torchrun_launch import run_ranks

TRAINEE = Path(__file__).with_name("release_trainee.py")


def test_close_ends_every_thread_the_checkpointer_started(tmp_path):
    report = tmp_path / "report"
    run_ranks(2, TRAINEE, report, tmp_path / "local", f"file://{tmp_path / 'durable'}")
    for rank in (0, 1):
        seen = json.loads(Path(f"{report}.{rank}.json").read_text())
        assert seen["saved"], f"rank {rank}: the checkpoint did not commit"
        # Before: the default group's threads and the main thread. After close(): no more than those.
        assert len(seen["after"]) <= len(seen["before"]), (
            f"rank {rank}: threads before the Checkpointer {seen['before']}, after its close() {seen['after']}")
