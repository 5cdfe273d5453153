"""close() leaves no thread of the library behind in a torch.distributed job (2 gloo ranks under torchrun).

The library's gloo side groups have worker threads that live as long as the groups. Left to interpreter
shutdown, one of them can free a tensor after Python is gone and abort a process that had stopped cleanly
("terminate called without an active exception"), even when the script called
``dist.destroy_process_group()``; a stopped job then looks crashed. close() destroys them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

TRAINEE = Path(__file__).with_name("release_trainee.py")
TIMEOUT = 300  # generous: two ranks starting on a busy machine; nothing here waits on a clock


def test_close_ends_every_thread_the_checkpointer_started(tmp_path):
    report = tmp_path / "report"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(TRAINEE),
               str(report), str(tmp_path / "local"), f"file://{tmp_path / 'durable'}"]
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    # In a session of its own: a run that hangs is killed whole, its ranks included, not only the launcher.
    launcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                start_new_session=True)
    try:
        stdout, stderr = launcher.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(launcher.pid, signal.SIGKILL)
        stdout, stderr = launcher.communicate()
        raise AssertionError(f"torchrun did not end within {TIMEOUT}s:\n{stdout[-2000:]}\n{stderr[-4000:]}") from None
    assert launcher.returncode == 0, stdout[-2000:] + stderr[-4000:]
    for rank in (0, 1):
        seen = json.loads(Path(f"{report}.{rank}.json").read_text())
        assert seen["saved"], f"rank {rank}: the checkpoint did not commit"
        # Before: the default group's threads and the main thread. After close(): no more than those.
        assert len(seen["after"]) <= len(seen["before"]), (
            f"rank {rank}: threads before the Checkpointer {seen['before']}, after its close() {seen['after']}")
