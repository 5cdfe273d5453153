"""Test-only, never installed: a process started with this folder on PYTHONPATH and ``RUNNER_TEST_DIE_AFTER_NODE_START``
set kills itself with SIGKILL the moment a simulated node's process has started, before the local provider has
done anything else with it: the window of a controller that dies mid-launch (tests/providers/local/
test_launch_crash.py). Python imports ``sitecustomize`` at start-up; a node gets no ``RUNNER_*`` variable, so its
own processes, which see this folder too, are left alone."""

import os
import signal
import subprocess

NODE_MODULE = "runner.providers.local.node"

if os.environ.get("RUNNER_TEST_DIE_AFTER_NODE_START"):
    class _DiesAfterANodeStarts(subprocess.Popen):
        def __init__(self, args, *rest, **options):
            super().__init__(args, *rest, **options)
            if not isinstance(args, (str, bytes)) and NODE_MODULE in list(args):
                os.kill(os.getpid(), signal.SIGKILL)

    subprocess.Popen = _DiesAfterANodeStarts
