"""Test-only, never installed: makes SIGUSR1 block the receiving process's main thread for good while its other
threads run on. In a controller worker the main thread runs the event loop, so the signal makes the hung worker of
tests/controller/test_server_workers.py: alive, its leader election and heartbeat threads running, its listening
socket open, answering nothing. It reaches the test's processes through PYTHONPATH (Python imports
``sitecustomize`` at start-up)."""

import signal
import threading


def _hang_the_main_thread(signum, frame):
    threading.Event().wait()


signal.signal(signal.SIGUSR1, _hang_the_main_thread)
