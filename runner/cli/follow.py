"""Streaming a job's output (every attempt, each under a separator) and, for --follow, its state changes."""

from __future__ import annotations

import sys
import time

import click

from ..client import Client

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
    line once the one before it is complete; ``only_node`` keeps one node rank's output only."""

    def __init__(self, client: Client, job_id: str, only_attempt: int | None = None, only_node: int | None = None):
        self.client = client
        self.job_id = job_id
        self.only_attempt = only_attempt
        self.only_node = only_node
        self.offsets: dict[tuple[int, int], int] = {}
        self.finished: set[tuple[int, int]] = set()

    def _streams(self, row: dict) -> list[int]:
        ranks = list(range(row.get("num_nodes") or 1))
        if self.only_node is not None:
            ranks = [r for r in ranks if r == self.only_node]
        return ranks

    def poll(self) -> bool:
        """Print what is new; return True once every attempt is complete and the job has ended."""
        rows = self.client.get(f"/v1/jobs/{self.job_id}/restarts")
        if self.only_attempt is not None:
            rows = [r for r in rows if r["attempt"] == self.only_attempt]
        for row in rows:
            number = row["attempt"]
            for rank in self._streams(row):
                key = (number, rank)
                if key in self.finished:
                    continue
                if key not in self.offsets:
                    if not any(k[0] == number for k in self.offsets):
                        click.echo(separator(row))
                    if rank > 0 or self.only_node:
                        click.echo(node_separator(row, rank))
                    self.offsets[key] = 0
                if not self._print_new(number, rank):
                    break  # the next node's output only once this one's is complete
        return bool(rows) and all((r["attempt"], rank) in self.finished for r in rows for rank in self._streams(r))

    def _print_new(self, number: int, rank: int) -> bool:
        """Print one stream's new output; True once it is complete."""
        key = (number, rank)
        params = {"attempt": number, "offset": self.offsets[key]}
        if rank:
            params["node"] = rank
        while True:
            chunk = self.client.get(f"/v1/jobs/{self.job_id}/logs", params=params)
            if chunk["data"]:
                sys.stdout.write(chunk["data"])
                sys.stdout.flush()
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
        if not follow or done and client.get(f"/v1/jobs/{job_id}")["state"] in TERMINAL:
            return
        time.sleep(interval)


def follow_job(client: Client, job_id: str, interval: float = 0.5) -> str:
    """Stream state changes and output until the job ends; return its final state."""
    follower = LogFollower(client, job_id)
    last_event = 0
    while True:
        for event in client.get(f"/v1/jobs/{job_id}/events", params={"after": last_event}):
            last_event = event["id"]
            label = event["to_state"] or event["kind"]
            click.echo(f"[runner] {event['time']} {label}: {event['message']}", err=True)
        logs_done = follower.poll()
        job = client.get(f"/v1/jobs/{job_id}")
        if job["state"] in TERMINAL and logs_done:
            for event in client.get(f"/v1/jobs/{job_id}/events", params={"after": last_event}):
                click.echo(f"[runner] {event['time']} {event['to_state'] or event['kind']}: {event['message']}",
                           err=True)
            return job["state"]
        time.sleep(interval)
