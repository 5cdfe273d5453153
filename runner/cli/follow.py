"""Streaming a job's output (every attempt, each under a separator) and, for --follow, its state changes."""

from __future__ import annotations

import sys
import time
from collections import deque
from typing import TextIO

import click

from ..client import Client, NotFound
from .pipes import stop_if_reader_gone

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


def separator(row: dict) -> str:
    where = ", ".join(str(x) for x in (row.get("zone"), row.get("instance_type")) if x)
    return f"===== attempt {row['attempt']} ({where}) ====="


def node_separator(row: dict, rank: int) -> str:
    node = next((n for n in row.get("nodes") or [] if n["rank"] == rank), {})
    return f"----- attempt {row['attempt']}, node {rank} ({node.get('node')}) -----"


class LogFollower:
    """Prints each attempt's output once, in order, resuming from the last offset it printed.

    Of a multi-node attempt, node 0's output comes first (live), then each other node's under its own
    line once the one before it is complete; ``only_node`` keeps one node rank's output only. ``out``: where it
    goes (default: stdout, as it is when each line is printed)."""

    def __init__(self, client: Client, job_id: str, only_attempt: int | None = None, only_node: int | None = None,
                 out: TextIO | None = None):
        self.client = client
        self.out = out
        self.job_id = job_id
        self.only_attempt = only_attempt
        self.only_node = only_node
        self.offsets: dict[tuple[int, int], int] = {}
        self.finished: set[tuple[int, int]] = set()
        self.rows: list[dict] = []

    def _streams(self, row: dict) -> list[int]:
        ranks = list(range(row.get("num_nodes") or 1))
        # an elastic gang's replacements hold ranks past the job's (docs/elastic.md)
        ranks += sorted(n["rank"] for n in row.get("nodes") or [] if n["rank"] not in ranks)
        if self.only_node is not None:
            ranks = [r for r in ranks if r == self.only_node]
        return ranks

    def poll(self, rows: list[dict] | None = None, through: int | None = None) -> bool:
        """Print what is new (of attempts up to ``through``, when given; ``rows``: the restart log, when read
        already); return True once every attempt is complete."""
        if rows is None:
            rows = self.client.get(f"/v1/jobs/{self.job_id}/restarts")
        if self.only_attempt is not None:
            rows = [r for r in rows if r["attempt"] == self.only_attempt]
        self.rows = rows
        for row in rows:
            number = row["attempt"]
            if through is not None and number > through:
                break
            for rank in self._streams(row):
                key = (number, rank)
                if key in self.finished:
                    continue
                if key not in self.offsets:
                    if not any(k[0] == number for k in self.offsets):
                        click.echo(separator(row), file=self._out())
                    if rank > 0 or self.only_node:
                        click.echo(node_separator(row, rank), file=self._out())
                    self.offsets[key] = 0
                if not self._print_new(number, rank):
                    break  # the next node's output only once this one's is complete
        return bool(rows) and all((r["attempt"], rank) in self.finished for r in rows for rank in self._streams(r))

    def _out(self) -> TextIO:
        return self.out or sys.stdout

    def complete_through(self, number: int | None) -> bool:
        """Has every attempt up to ``number`` (every attempt, for None) printed all of its output?"""
        rows = [r for r in self.rows if number is None or r["attempt"] <= number]
        known = {r["attempt"] for r in rows}
        if number is not None and not known.issuperset(range(1, number + 1)):
            return False
        return all((r["attempt"], rank) in self.finished for r in rows for rank in self._streams(r))

    def _print_new(self, number: int, rank: int) -> bool:
        """Print one stream's new output; True once it is complete."""
        key = (number, rank)
        params = {"attempt": number, "offset": self.offsets[key]}
        if rank:
            params["node"] = rank
        while True:
            chunk = self.client.get(f"/v1/jobs/{self.job_id}/logs", params=params)
            if chunk["data"]:
                out = self._out()
                out.write(chunk["data"])
                out.flush()
            self.offsets[key] = params["offset"] = chunk["offset"]
            if chunk["complete"]:
                self.finished.add(key)
                return True
            if not chunk["data"]:
                return False


def follow_logs(client: Client, job_id: str, attempt: int | None, follow: bool, interval: float = 0.5,
                only_node: int | None = None) -> None:
    follower = LogFollower(client, job_id, attempt, only_node)
    while True:
        done = follower.poll()
        if attempt is not None and not follower.rows:  # no such attempt: an error once none can come
            if client.get(f"/v1/jobs/{job_id}")["state"] in TERMINAL:
                raise NotFound(_no_attempt(client, job_id, attempt))
            if not follow:
                return  # the job goes on: the attempt may come (--follow waits for it)
        elif not follow or done and client.get(f"/v1/jobs/{job_id}")["state"] in TERMINAL:
            return
        stop_if_reader_gone(follower.out or sys.stdout)  # (`runner logs JOB -f | head -1` ends once head has)
        time.sleep(interval)


def _no_attempt(client: Client, job_id: str, attempt: int) -> str:
    count = len(client.get(f"/v1/jobs/{job_id}/restarts"))
    has = "has no attempt yet" if count == 0 else f"has attempt{'s 1 to' if count > 1 else ''} {count}"
    return f"job {job_id} has no attempt {attempt} (it {has}); see runner restarts {job_id}"


def follow_job(client: Client, job_id: str, interval: float = 0.5, output: TextIO | None = None) -> str:
    """Stream state changes (to stderr) and the job's output (to ``output``, default stdout) until the job ends;
    return its final state.

    Lines come in the order things happened: a state change that ends an attempt comes after that attempt's
    output, a line about an attempt after the output of the ones before it, and the job's end after all of it
    (an attempt's last output reaches the controller a moment after its end is recorded)."""
    follower = LogFollower(client, job_id, out=output)
    pending: deque[dict] = deque()
    last_event = 0
    while True:
        rows = client.get(f"/v1/jobs/{job_id}/restarts")  # first: every attempt listed has its events below
        job = client.get(f"/v1/jobs/{job_id}")
        for event in client.get(f"/v1/jobs/{job_id}/events", params={"after": last_event}):
            last_event = event["id"]
            pending.append(event)
        while True:
            while pending and follower.complete_through(_waits_for(pending[0])):
                event = pending.popleft()
                click.echo(f"[runner] {event['time']} {event['to_state'] or event['kind']}: {event['message']}",
                           err=True)
            printed = len(follower.finished)
            logs_done = follower.poll(rows, through=_waits_for(pending[0]) if pending else None)
            if len(follower.finished) == printed:
                break
        if job["state"] in TERMINAL and logs_done and not pending:
            return job["state"]
        stop_if_reader_gone(output or sys.stdout)
        time.sleep(interval)


def _waits_for(event: dict) -> int | None:
    """The last attempt whose output comes before ``event`` (None: every attempt's). The job's end waits for its own
    attempt's output by number: an attempt that started and ended between the restart log's read and the events'
    is not in that read yet, and "every attempt's" would not wait for it."""
    attempt = event.get("attempt")
    if event.get("to_state") in TERMINAL:
        return attempt
    if attempt is None:
        return 0
    return attempt if event.get("to_state") else attempt - 1
