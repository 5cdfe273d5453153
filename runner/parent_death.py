"""A child process that dies with its parent (Linux's parent-death signal), for every side that starts one: the agent
its job's command (agents/process_tree.py), the controller its workers (runner/controller/supervisor.py).
Standard library only.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def _load_prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()  # looked up once, in the parent: the child only calls it


def die_with_parent_preexec(signum: int = signal.SIGTERM):
    """A ``preexec_fn`` that starts the child as a new process group's leader and has the kernel send it
    ``signum`` when the thread that forked it dies (so when the parent dies, even by SIGKILL). Between fork
    and exec it makes two system calls and takes no lock another thread could hold."""
    prctl = _PRCTL
    parent = os.getpid()

    def preexec() -> None:
        os.setpgrp()
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)
            if os.getppid() != parent:  # the parent died before the request took effect: nobody to run for
                os._exit(1)

    return preexec
