"""Two controllers on one Postgres; the leader is SIGKILLed, twice, while a job prints a line every half
second: every line the job printed is in `runner logs`, once, in order.

The second time, the newest stored chunks are also taken out of the database before the kill, as a database
failover that loses its last commits would (an asynchronous replica promoted): the controller then has less
than it had acknowledged, and the agent, which asks where the controller stands after a failed send, sends
the missing bytes again from the node's own copy of the output."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import psycopg

from conftest import kill_nodes, write_job
from test_failover import cli_for, start_team

LINES = 30  # ten lines after the go-ahead: appended after the second failover
# After line 20 the job waits for the test's go-ahead (a file), so a slow machine cannot let it finish first.
JOB = """
name: ticking
run: for i in $(seq 1 {lines}); do echo "line $i"; sleep 0.5; if [ $i = 20 ]; then while [ ! -e {go} ]; do sleep 0.1; done; fi; done
resources: {{cloud: [local]}}
recovery: {{max_preemptions: 0, max_failures: 0, resume_drill: "off"}}
"""


def _printed(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"^line (\d+)$", text, re.M)]


def _kill_leader(team) -> None:
    leader = team.leader()
    team.members[leader].kill(signal.SIGKILL)
    team.leader(exclude=leader)  # the other one took over
    team.start(leader)


def _lose_newest_chunks(db_url: str, job_id: str) -> int:
    """Delete the newer half of the job's stored output chunks, as a failover that lost its last commits would;
    how many went. No append is under way meanwhile: the node's agent is stopped (SIGSTOP) and any append it
    had sent has finished, so what is lost is the stream's end, never a hole in it."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        deadline = time.monotonic() + 60
        while conn.execute("SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() AND "
                           "pid <> pg_backend_pid() AND state <> 'idle' AND query ILIKE '%log_chunks%'").fetchone()[0]:
            assert time.monotonic() < deadline, "an append never finished"
            time.sleep(0.05)
        starts = [row[0] for row in conn.execute("SELECT start FROM log_chunks WHERE job_id = %s ORDER BY start",
                                                 (job_id,))]
        lost = starts[len(starts) // 2:]
        conn.execute("DELETE FROM log_chunks WHERE job_id = %s AND start >= %s", (job_id, lost[0]))
    return len(lost)


def _agent_pid(home: Path) -> int:
    """The pid of the (only) local node's agent."""
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0") if entry.name.isdigit() else []
        except OSError:
            continue
        if b"agent" in argv and any(str(home / "nodes").encode() in arg for arg in argv):
            return int(entry.name)
    seen = [p.name for p in Path("/proc").iterdir() if p.name.isdigit() and b"agent" in _argv(p)]
    raise AssertionError(f"no agent process under {home}: {[_argv(Path('/proc') / pid) for pid in seen]}")


def _argv(entry: Path) -> list[bytes]:
    try:
        return (entry / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


def test_every_line_printed_around_leader_kills_is_stored_once_in_order(tmp_path, postgres):
    team = start_team(tmp_path, postgres, size=2)
    cli = cli_for(team)
    try:
        go = tmp_path / "go"
        job_id = cli.json("submit", str(write_job(tmp_path / "job", JOB.format(lines=LINES, go=go))))["id"]
        cli.wait_for_output(job_id, r"^line 6$", timeout=180)
        _kill_leader(team)
        cli.wait_for_output(job_id, r"^line 16$", timeout=180)
        agent = _agent_pid(team.home)
        os.kill(agent, signal.SIGSTOP)
        try:
            assert _lose_newest_chunks(team.db_url, job_id) >= 2
            _kill_leader(team)
        finally:
            os.kill(agent, signal.SIGCONT)
            go.touch()
        job = cli.wait_for(job_id, lambda j: j["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"), timeout=240,
                           what="the end of the job")
        assert job["state"] == "SUCCEEDED" and job["attempts"] == 1, job
        assert _printed(cli("logs", job_id).stdout) == list(range(1, LINES + 1))
    finally:
        team.stop()
        kill_nodes(team.home)
