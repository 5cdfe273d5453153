"""Run a script of this folder under torchrun with N local ranks (gloo, CPU), in a session of its own: a run that
does not end in time (a rank stuck in a collective) is killed whole, its ranks included, not only the launcher."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

TIMEOUT = 240  # generous: a busy 2-core machine starts 4 ranks slowly; nothing here waits on a clock


def run_ranks(ranks: int, script: Path, *args, check: bool = True, timeout: float = TIMEOUT,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``env``: variables added to this process's for the ranks."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
               str(script), *map(str, args)]
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1", **(env or {})}
    launcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                start_new_session=True)
    try:
        stdout, stderr = launcher.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(launcher.pid, signal.SIGKILL)
        stdout, stderr = launcher.communicate()
        raise AssertionError(f"torchrun did not end within {timeout}s:\n{stdout[-3000:]}\n{stderr[-5000:]}") from None
    done = subprocess.CompletedProcess(command, launcher.returncode, stdout, stderr)
    if check and done.returncode != 0:
        raise AssertionError(f"torchrun exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}")
    return done
