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
    the restart log, the job's events and the end of every node's output."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.5)
    happened = _what_happened(runner, job_id)
    raise AssertionError(f"timed out waiting for {what}; restarts: {runner.restarts(job_id)}; {happened}")


def _what_happened(runner: Runner, job_id: str) -> str:
    """The job's events (why each replacement left, among them) and the end of every node's output, for a failure's
    message: a replacement that failed on a busy machine otherwise leaves no trace in it."""
    events = runner.events(job_id)
    nodes = sorted({n["rank"] for row in runner.restarts(job_id) for n in row.get("nodes") or []})
    outputs = "; ".join(f"node {rank}'s output ends: {runner.output(job_id, node=rank)[-1500:]}" for rank in nodes)
    return "events: " + "; ".join(f"{e['kind']}: {e['message']}" for e in events) + "; " + outputs
