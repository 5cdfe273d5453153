"""Waits of the elastic gang tests: they poll what `runner restarts` and `runner logs --node 0` print through the
CLI's own code in this process (Runner.restarts, Runner.output): a CLI process twice a second took CPU from the
torch processes waited on."""

from __future__ import annotations

import time

from conftest import Runner


def world_sizes(runner: Runner, job_id: str) -> list[int]:
    """The world sizes the job's first attempt went through, in order."""
    return [w["world_size"] for w in runner.restarts(job_id)[0].get("world_sizes") or []]


def wait_until(condition, timeout: float, what: str, runner: Runner, job_id: str) -> None:
    """Poll ``condition`` until it holds; past ``timeout`` (a bound, not an expectation) fail naming ``what``, with
    the restart log and the end of node 0's output."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}; restarts: {runner.restarts(job_id)}; node 0's output ends: "
                         f"{runner.output(job_id, node=0)[-3000:]}")
