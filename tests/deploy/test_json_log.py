"""The daemons' JSON log stays one JSON object per line when something logs a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = r'''
import logging, sys, threading
from pathlib import Path
from runner.logconfig import configure_logging

configure_logging(Path(sys.argv[1]))
if sys.argv[2] == "stdlib":
    try:
        1 / 0
    except ZeroDivisionError:
        logging.getLogger("uvicorn.error").exception("Exception in ASGI application")
else:
    worker = threading.Thread(target=lambda: 1 / 0, name="worker")
    worker.start()
    worker.join()
'''


def _log_lines(tmp_path: Path, case: str) -> list[dict]:
    path = tmp_path / "daemon.jsonl"
    subprocess.run([sys.executable, "-c", SCRIPT, str(path), case], check=True, timeout=60)
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_stdlib_logger_traceback_is_one_json_line(tmp_path: Path):
    """uvicorn's 'Exception in ASGI application' with its traceback is a JSON line with an exception field."""
    (line,) = _log_lines(tmp_path, "stdlib")
    assert line["event"] == "Exception in ASGI application" and line["level"] == "error"
    assert "ZeroDivisionError" in line["exception"]


def test_a_thread_that_dies_is_logged_as_one_json_line(tmp_path: Path):
    """A thread killed by an exception is reported in the JSON log with its traceback, not as bare text."""
    (line,) = _log_lines(tmp_path, "thread")
    assert line["event"] == "thread crashed" and line["thread"] == "worker"
    assert "ZeroDivisionError" in line["exception"]


LOG_AFTER_CAPTURE = r'''
import io, sys
import structlog
from agents.watchers.watch import watch

captured, real = io.StringIO(), sys.stderr
sys.stderr = captured          # a caller captures stderr while watch() sets logging up
assert watch("oracle", io.StringIO(), env={}) == 2
sys.stderr = real
captured.close()
structlog.get_logger("later").warning("logged after the capture ended")
'''


def test_logging_set_up_while_stderr_was_captured_goes_on_to_the_stderr_of_the_moment():
    """A logger set up while stderr was replaced writes to today's stderr, never to the closed stream.

    Bound to the replaced stream, every later log line in the process raised "I/O operation on closed file".
    """
    done = subprocess.run([sys.executable, "-c", LOG_AFTER_CAPTURE], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "logged after the capture ended" in done.stderr
