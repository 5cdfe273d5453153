"""`runner server --workers N`: N controller processes on one Postgres database, all listening on one port.

Real processes throughout: the parent, its workers, the local provider's node and its agent, the CLI. Every wait
polls for the event with a generous timeout; nothing depends on how fast the machine is.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import time
from pathlib import Path

import psutil
import pytest
import requests
import yaml

from conftest import Controller, Runner, kill_nodes, write_job

START_SECONDS = 120  # a parent and two workers importing the controller on a busy 2-core machine
JOB = """
name: counted
run: for i in $(seq 1 20); do echo "line $i"; done
resources: {cloud: [local]}
recovery: {resume_drill: "off"}
"""


def wait_until(predicate, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def gone(process: psutil.Process) -> bool:
    """Has this process ended (reaped, or a zombie whose parent has not reaped it yet)?"""
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def log_lines(home: Path) -> list[dict]:
    lines = []
    for line in (home / "controller.jsonl").read_text().splitlines():
        try:
            lines.append(json.loads(line))
        except ValueError:
            pass  # a line still being written
    return lines


class Workers:
    """`runner server --workers 2` on a fresh Postgres database, in a home of the test's own."""

    def __init__(self, folder: Path, postgres, count: int = 2, env: dict[str, str] | None = None):
        self.home = folder / "home"
        self.home.mkdir()
        (self.home / "config.yaml").write_text(yaml.safe_dump({"clouds": {"local": {"time_scale": 0.05}}}))
        self.db_url = postgres.new_database()
        self.controller = Controller(self.home, db_url=self.db_url, extra_args=("--workers", str(count)),
                                     env=env)
        self.controller.start(timeout=START_SECONDS)
        self.parent = psutil.Process(self.controller.process.pid)
        self.cli = Runner(self.home)
        self.cli.env.update({"RUNNER_SERVER": self.controller.url, "RUNNER_TOKEN": self.controller.token})

    @property
    def port(self) -> int:
        return int(self.controller.url.rsplit(":", 1)[1])

    def workers(self) -> list[psutil.Process]:
        return [child for child in self.parent.children() if not gone(child)]

    def answers(self) -> bool:
        """The API answers an authenticated request on a new connection (the kernel picks the worker)."""
        reply = requests.get(self.controller.url + "/v1/jobs", headers=self.controller.headers(), timeout=30)
        return reply.status_code == 200

    def stop(self) -> None:
        self.controller.stop()
        kill_nodes(self.home)


@pytest.fixture
def workers(tmp_path, postgres):
    team = Workers(tmp_path, postgres)
    yield team
    team.stop()


def test_two_workers_listen_on_one_port_and_serve_a_job_its_node_and_the_cli(workers, tmp_path):
    """Both workers listen on the port the parent recorded; a job submitted through the CLI runs on a local node
    whose agent reports to that port, and its output, state and restart log come back through the CLI."""
    children = wait_until(lambda: len(workers.workers()) == 2 and workers.workers(), "two workers")
    for child in children:
        listening = [c for c in child.net_connections("tcp") if c.status == psutil.CONN_LISTEN]
        assert [c.laddr.port for c in listening] == [workers.port], (child.pid, listening)
    recorded = json.loads((workers.home / "controller.json").read_text())
    assert recorded["pid"] == workers.parent.pid and recorded["url"] == workers.controller.url
    leaders = {line.get("worker") for line in log_lines(workers.home) if line.get("event", "").startswith("leader: ")}
    assert leaders in ({0}, {1}), leaders  # one worker leads (runs the reconciler), the other serves the API

    job_id = workers.cli.json("submit", str(write_job(tmp_path / "job", JOB)))["id"]
    job = workers.cli.wait_for(job_id, lambda j: j["state"] in ("SUCCEEDED", "FAILED"), timeout=180,
                               what="the job to end")
    assert job["state"] == "SUCCEEDED", job
    logs = workers.cli("logs", job_id)
    assert logs.returncode == 0 and "line 1\n" in logs.stdout and "line 20\n" in logs.stdout, logs.stdout[-2000:]
    restarts = workers.cli.json("restarts", job_id)
    assert [row["end_reason"] for row in restarts] == ["succeeded"], restarts
    jobs = workers.cli("jobs")
    assert jobs.returncode == 0 and job_id in jobs.stdout


def test_a_second_group_on_the_same_port_is_refused(workers, tmp_path):
    """SO_REUSEPORT lets processes of one user share a port: a second `--workers` parent must not join this one's
    unnoticed. Its port reservation is refused as in use, and it exits naming the port."""
    other = tmp_path / "other"
    other.mkdir()
    result = Runner(other)("server", "--data-dir", str(other), "--port", str(workers.port), "--db", workers.db_url,
                           "--workers", "2", timeout=START_SECONDS)
    assert result.returncode == 1 and f"port {workers.port}" in result.stderr and "in use" in result.stderr, result
    assert len(workers.workers()) == 2 and workers.answers()


def test_a_killed_worker_leaves_the_api_answering_and_is_started_again(workers):
    first = wait_until(lambda: len(workers.workers()) == 2 and workers.workers(), "two workers")
    victim, survivor = first
    victim.send_signal(signal.SIGKILL)
    # Reaped, not only a zombie: a killed process's main thread shows as a zombie while its other threads still
    # exit, and its listening socket closes with the last of them (a connection the kernel gave that socket in
    # between is reset). The parent reaps it only once every thread has gone.
    wait_until(lambda: not victim.is_running(), "the killed worker to end and be reaped")
    # Its listening socket died with it: every new connection reaches a worker that answers.
    assert all(workers.answers() for _ in range(10))

    def replacement():
        now = workers.workers()
        return len(now) == 2 and {p.pid for p in now} - {victim.pid, survivor.pid}

    new_pid = next(iter(wait_until(replacement, "the parent to start a worker in its place", timeout=START_SECONDS)))
    said = wait_until(lambda: [line for line in log_lines(workers.home)
                               if line.get("event") == "controller worker exited; starting it again"],
                      "the parent to log the worker's death")
    assert said[0]["pid"] == victim.pid and said[0]["exit"] == "killed by SIGKILL", said
    wait_until(lambda: any(line.get("event") == "controller worker ready" and line.get("pid") == new_pid
                           for line in log_lines(workers.home)), "the new worker to be ready", timeout=START_SECONDS)
    listening = wait_until(lambda: [c for c in psutil.Process(new_pid).net_connections("tcp")
                                    if c.status == psutil.CONN_LISTEN], "the new worker to listen")
    assert [c.laddr.port for c in listening] == [workers.port]
    assert survivor.is_running() and all(workers.answers() for _ in range(10))


HANG_HOOK = Path(__file__).resolve().parent / "worker_hang_hook"  # SIGUSR1 blocks a worker's event loop for good
WATCHDOG_SECONDS = 8  # the parent's WatchdogSec, and so its workers'


class Manager:
    """The test as systemd: a notify socket that the parent is told of, with a watchdog interval."""

    def __init__(self):
        self.address = f"runner-test-manager-{secrets.token_hex(4)}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(b"\0" + self.address.encode())
        self.sock.setblocking(False)
        self.messages: list[bytes] = []

    def env(self) -> dict[str, str]:
        return {"NOTIFY_SOCKET": "@" + self.address, "WATCHDOG_USEC": str(WATCHDOG_SECONDS * 1_000_000)}

    def received(self, line: bytes) -> int:
        while True:
            try:
                self.messages.append(self.sock.recv(4096))
            except BlockingIOError:
                return sum(line in message.split(b"\n") for message in self.messages)


def test_a_hung_worker_is_killed_and_started_again_while_the_api_answers(tmp_path, postgres):
    """A worker whose event loop is stuck keeps its process and its share of the port's connections. It stops
    pinging its watchdog, so the parent kills it, saying so with its pid and how long it was silent, and starts
    another in its place; the API answers every request on the port again, and the other worker was left alone.
    The parent, under a systemd watchdog of its own, passes that interval on to its workers and pings it."""
    manager = Manager()
    hook = os.pathsep.join(filter(None, (str(HANG_HOOK), os.environ.get("PYTHONPATH"))))
    team = Workers(tmp_path, postgres, env={**manager.env(), "PYTHONPATH": hook})
    try:
        victim, survivor = wait_until(lambda: len(team.workers()) == 2 and team.workers(), "two workers")
        wait_until(lambda: manager.received(b"READY=1"), "the parent to tell its manager it is ready")
        victim.send_signal(signal.SIGUSR1)
        killed = wait_until(lambda: [line for line in log_lines(team.home)
                                     if line.get("event") == "controller worker stopped answering its watchdog; "
                                                             "killing it"], "the parent to kill the hung worker",
                            timeout=START_SECONDS)
        # (the log rounds the silence to a tenth of a second: 8.04 s reads 8.0)
        assert killed[0]["pid"] == victim.pid and killed[0]["silent_seconds"] >= WATCHDOG_SECONDS, killed
        wait_until(lambda: not victim.is_running(), "the hung worker to end and be reaped")

        def replacement():
            now = team.workers()
            return len(now) == 2 and {p.pid for p in now} - {victim.pid, survivor.pid}

        new_pid = next(iter(wait_until(replacement, "a worker in the hung one's place", timeout=START_SECONDS)))
        wait_until(lambda: any(line.get("event") == "controller worker ready" and line.get("pid") == new_pid
                               for line in log_lines(team.home)), "the new worker to be ready", timeout=START_SECONDS)
        assert survivor.is_running() and all(team.answers() for _ in range(10))
        kills = [line["pid"] for line in log_lines(team.home)
                 if line.get("event", "").startswith("controller worker stopped")]
        assert kills == [victim.pid], kills  # the workers that answered were never taken for hung ones
        assert manager.received(b"WATCHDOG=1") >= 1
    finally:
        team.stop()
        manager.sock.close()


SLOW_RECONCILER_HOOK = Path(__file__).resolve().parent / "slow_reconciler_hook"  # a 10-minute tick unless woken


def test_a_job_submitted_to_a_worker_that_does_not_lead_starts_at_once(tmp_path, postgres):
    """A submit taken by a worker that does not lead wakes the leader's reconciler through the database: the job gets
    its attempt although the leader's next tick is 10 minutes away (the hook makes every tick that slow)."""
    hook = os.pathsep.join(filter(None, (str(SLOW_RECONCILER_HOOK), os.environ.get("PYTHONPATH"))))
    team = Workers(tmp_path, postgres, env={"PYTHONPATH": hook})
    try:
        wait_until(lambda: len(team.workers()) == 2, "two workers")

        def follower_connection():  # a keep-alive connection that the kernel gave to the worker that does not lead
            session = requests.Session()
            if session.get(team.controller.url + "/healthz", timeout=30).json()["leader"] is False:
                return session
            session.close()
            return None

        session = wait_until(follower_connection, "a connection to the worker that does not lead")
        with session:
            reply = session.post(team.controller.url + "/v1/jobs", headers=team.controller.headers(), timeout=30,
                                 json={"spec": yaml.safe_load(JOB)})
            assert reply.status_code == 201, reply.text
            assert session.get(team.controller.url + "/healthz", timeout=30).json()["leader"] is False
        job_id = reply.json()["id"]
        job = team.cli.wait_for(job_id, lambda j: j["state"] != "PENDING", timeout=120,
                                what="the job to leave PENDING")
        assert job["attempts"] >= 1, job
    finally:
        team.stop()


def test_server_stop_ends_the_parent_and_every_worker(workers):
    """`runner server stop` finds the parent in the controller file and SIGTERMs it; it stops every worker and
    exits 0, leaving no process behind and no controller file."""
    children = wait_until(lambda: len(workers.workers()) == 2 and workers.workers(), "two workers")
    stopped = workers.cli("server", "stop", "--data-dir", str(workers.home))
    assert stopped.returncode == 0 and f"pid {workers.parent.pid}" in stopped.stdout, stopped
    assert workers.controller.process.wait(60) == 0
    assert all(gone(child) for child in children)
    assert not (workers.home / "controller.json").exists()


def test_a_parent_killed_outright_takes_its_workers_with_it(workers):
    """Even a SIGKILL, which the parent cannot handle, leaves no worker serving: each has a parent-death signal."""
    children = wait_until(lambda: len(workers.workers()) == 2 and workers.workers(), "two workers")
    workers.parent.send_signal(signal.SIGKILL)
    workers.controller.process.wait(60)
    wait_until(lambda: all(gone(child) for child in children), "every worker to end")


def test_several_workers_on_sqlite_are_refused_as_bad_input(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    run = Runner(home)
    for count, says in (("2", "--workers 2 needs Postgres"), ("0", "--workers")):
        result = run("server", "--data-dir", str(home), "--port", "0", "--workers", count)
        assert result.returncode == 2 and says in result.stderr, result
    assert not (home / "controller.json").exists()
