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


class LogFollower:
    """Prints each attempt's output once, in order, resuming from the last offset it printed."""

    def __init__(self, client: Client, job_id: str, only_attempt: int | None = None):
        self.client = client
        self.job_id = job_id
        self.only_attempt = only_attempt
        self.offsets: dict[int, int] = {}
        self.finished: set[int] = set()

    def poll(self) -> bool:
        """Print what is new; return True once every attempt is complete and the job has ended."""
        rows = self.client.get(f"/v1/jobs/{self.job_id}/restarts")
        if self.only_attempt is not None:
            rows = [r for r in rows if r["attempt"] == self.only_attempt]
        for row in rows:
            number = row["attempt"]
            if number in self.finished:
                continue
            if number not in self.offsets:
                click.echo(separator(row))
                self.offsets[number] = 0
            while True:
                chunk = self.client.get(f"/v1/jobs/{self.job_id}/logs",
                                        params={"attempt": number, "offset": self.offsets[number]})
                if chunk["data"]:
                    sys.stdout.write(chunk["data"])
                    sys.stdout.flush()
                self.offsets[number] = chunk["offset"]
                if chunk["complete"]:
                    self.finished.add(number)
                if not chunk["data"] or chunk["complete"]:
                    break
        return bool(rows) and all(r["attempt"] in self.finished for r in rows)


def follow_logs(client: Client, job_id: str, attempt: int | None, follow: bool, interval: float = 0.5) -> None:
    follower = LogFollower(client, job_id, attempt)
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
