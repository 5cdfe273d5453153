"""Shared fixtures: a RUNNER_HOME per test, the CLI as a subprocess, a real controller on loopback."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager, redirect_stdout
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator

import pytest
import requests
import yaml

REPO = Path(__file__).resolve().parents[1]


class Runner:
    """Drives the real `runner` CLI in a subprocess with this test's RUNNER_HOME."""

    def __init__(self, home: Path):
        self.home = home
        # Without COLUMNS, a table's width does not depend on the terminal the tests run in.
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("RUNNER_") and k != "COLUMNS"}
        self.env.update({"RUNNER_HOME": str(home), "PYTHONUNBUFFERED": "1"})

    def __call__(self, *args: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "runner.cli.main", *args], capture_output=True, text=True,
                              timeout=timeout, env={**self.env, **(env or {})}, cwd=self.home)

    def json(self, *args: str, **kwargs):
        result = self(*args, "--json", **kwargs)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    def wait_for(self, job_id: str, predicate, timeout: float = 60, what: str = "condition") -> dict:
        """Poll the job (what `runner status JOB --json` prints) until ``predicate`` holds; return it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = self.job(job_id)
            if predicate(job):
                return job
            time.sleep(0.3)
        raise AssertionError(f"timed out waiting for {what}; job is {job}")

    def wait_for_output(self, job_id: str, pattern: str, timeout: float = 90, attempt: int | None = None,
                        node: int | None = None) -> str:
        """Wait until the job's output (``runner logs``, of one ``attempt``/``node`` where given) has a match of
        ``pattern`` (a regex, multiline); return the output."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            output = self.output(job_id, attempt, node)
            if re.search(pattern, output, re.M):
                return output
            time.sleep(0.2)
        raise AssertionError(f"the job never printed {pattern!r}; its output ends: {output[-2000:]}")

    # For polling, and for reading what a job left where the CLI is not what a test is about: what the CLI would
    # print, by the CLI's own code run in this process against the controller it would reach (RUNNER_SERVER,
    # RUNNER_TOKEN). A CLI start costs most of a second of CPU, and a wait polls several times a second on a
    # 2-core machine that the job under test needs. Where the CLI finds its controller by itself, the CLI.

    def job(self, job_id: str) -> dict:
        """What `runner status JOB --json` prints."""
        with self._client() as client:
            return self.json("status", job_id) if client is None else client.get(f"/v1/jobs/{job_id}")

    def restarts(self, job_id: str) -> list[dict]:
        """What `runner restarts JOB --json` prints."""
        with self._client() as client:
            return self.json("restarts", job_id) if client is None else client.get(f"/v1/jobs/{job_id}/restarts")

    def events(self, job_id: str) -> list[dict]:
        """The job's events, as the controller's API gives them (empty where no client is set up: the CLI prints
        them only while it follows a job)."""
        with self._client() as client:
            return [] if client is None else client.get(f"/v1/jobs/{job_id}/events")

    def output(self, job_id: str, attempt: int | None = None, node: int | None = None) -> str:
        """What `runner logs JOB [--attempt N] [--node R]` prints."""
        with self._client() as client:
            if client is not None:
                return _logs(client, job_id, attempt, node)
        args = [*(["--attempt", str(attempt)] if attempt is not None else []),
                *(["--node", str(node)] if node is not None else [])]
        return self("logs", job_id, *args).stdout

    @contextmanager
    def _client(self):
        url, token = self.env.get("RUNNER_SERVER"), self.env.get("RUNNER_TOKEN")
        if not (url and token):
            yield None
            return
        from runner.client import Client

        client = Client(url, token)
        try:
            yield client
        finally:
            client.session.close()


def _logs(client, job_id: str, attempt: int | None, node: int | None) -> str:
    """What `runner logs JOB [--attempt N] [--node R]` prints, by the command's own code."""
    from runner.cli.follow import follow_logs

    printed = io.StringIO()
    with redirect_stdout(printed):
        follow_logs(client, job_id, attempt, False, only_node=node)
    return printed.getvalue()


class Controller:
    """A `runner server` process on a free loopback port; ``env`` adds variables (RUNNER_* ones too);
    ``db_url``: its --db (default: SQLite in ``home``)."""

    def __init__(self, home: Path, env: dict[str, str] | None = None, db_url: str | None = None,
                 extra_args: tuple[str, ...] = ()):
        self.home = home
        self.extra_env = dict(env or {})
        self.db_url = db_url
        self.extra_args = extra_args
        self.process: subprocess.Popen | None = None

    def start(self, port: int = 0, timeout: float = 30) -> "Controller":
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUNNER_")}
        env.update(self.extra_env, RUNNER_HOME=str(self.home))
        (self.home / "controller.json").unlink(missing_ok=True)
        db = ["--db", self.db_url] if self.db_url else []
        self.process = subprocess.Popen(
            [sys.executable, "-m", "runner.cli.main", "server", "--data-dir", str(self.home), "--port", str(port),
             *db, *self.extra_args],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"controller exited: {self.process.stdout.read().decode()}")
            try:
                info = json.loads((self.home / "controller.json").read_text())
                requests.get(info["url"] + "/v1/health", headers=self.headers(), timeout=2).raise_for_status()
                self.url = info["url"]
                return self
            except (OSError, ValueError, requests.RequestException):
                time.sleep(0.1)
        self.kill()  # no test holds it yet to stop it: it must not outlive the test
        raise AssertionError("controller did not start")

    @property
    def token(self) -> str:
        return (self.home / "admin-token").read_text().strip()

    def headers(self, token: str | None = None) -> dict:
        return {"Authorization": f"Bearer {token or self.token}"}

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:  # a failure, but first nothing is left running: it, nor its nodes
                self.process.kill()
                self.process.wait()
                kill_nodes(self.home)
                raise AssertionError(f"the controller did not exit within 20 s of {signal.Signals(sig).name}; "
                                     "killed, with its nodes") from None

    def stop(self) -> None:
        self.kill(signal.SIGTERM)


def kill_nodes(home: Path) -> None:
    """Kill every simulated node left under ``home`` (a test must not leak processes)."""
    from runner.providers.local.processes import kill_node

    for ref_file in home.glob("nodes/*/ref"):
        kill_node(ref_file.read_text())  # with torchrun's workers, in sessions of their own


def shared_controller(tmp_path_factory, time_scale: float) -> Iterator[Runner]:
    """A controller on the local market at ``time_scale`` for a module's tests that each read only their own jobs
    (a controller start is a second of CPU): see ``local_controller``."""
    yield from local_controller(tmp_path_factory.mktemp("home"), time_scale)


def local_controller(home: Path, time_scale: float) -> Iterator[Runner]:
    """A controller in ``home`` on the local market at ``time_scale``: the CLI driver, pointed at it; stopped, its
    nodes killed, at the end."""
    (home / "config.yaml").write_text(yaml.safe_dump({"clouds": {"local": {"time_scale": time_scale}}}))
    controller = Controller(home).start()
    runner = Runner(home)
    runner.env.update({"RUNNER_SERVER": controller.url, "RUNNER_TOKEN": controller.token})
    yield runner
    controller.stop()
    kill_nodes(home)


BOTH_DATABASES = ("sqlite", "postgres")
TESTS = Path(__file__).resolve().parent
# The folders whose tests of the store and the controller run on both databases by default. A module there that
# must stay on SQLite says why in ``SQLITE_ONLY = "..."`` (a test: ``@pytest.mark.sqlite_only("why")``); elsewhere a
# module opts in with ``ON_BOTH_DATABASES = True``, a test with ``@pytest.mark.on_both_databases`` (tests/cli and
# tests/e2e start real node processes, so they stay on SQLite unless they are about the store).
ON_BOTH_DATABASES_IN = ("controller", "scheduler", "state", "web", "costpolicy")
# Set by .ci/run: there a missing Postgres fails the Postgres half instead of skipping it.
REQUIRE_POSTGRES = "RUNNER_TESTS_REQUIRE_POSTGRES"


def pytest_configure(config):
    config.addinivalue_line("markers", "sqlite_only(why): this test stays on SQLite where its module runs on both")
    config.addinivalue_line("markers", "on_both_databases: this test runs on SQLite and Postgres where its module does not")
    config.addinivalue_line("markers", "start_early(why): under -n, start this test with the end-to-end tests (minutes of "
                                       "torch processes), not late, where it would make the run's tail")


def pytest_collection_modifyitems(config, items):
    """The slowest tests first (tests/xdist_schedule.py); within a rank the collection order stays."""
    from xdist_schedule import start_order

    items.sort(key=lambda item: start_order(item, TESTS))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto`: one worker more than the cores this process may use, three at least (PYTEST_XDIST_AUTO_NUM_WORKERS
    says otherwise). The slowest tests alternate between starting torch in their processes (CPU) and waiting on them:
    run alone, each keeps 0.2 to 1.1 of a core busy, 0.8 on average, so a third worker keeps two cores busy (xdist's
    own auto, one per core, would leave them idle), and a fourth would only queue for them."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS", "").isdigit():
        return int(os.environ["PYTEST_XDIST_AUTO_NUM_WORKERS"])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)  # macOS: none
    return max(3, cores + 1)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Under `-n N`: units of work as tests/xdist_schedule.py says, in collection order (slowest first)."""
    if config.getvalue("dist") != "load":  # another --dist asked for by name: xdist's own
        return None
    from xdist_schedule import SharedScenarioScheduling, shared_scenario_modules

    config.option.loadscopereorder = False  # keep the collection order, not the biggest unit first
    return SharedScenarioScheduling(config, log, shared_scenario_modules(TESTS, config.rootpath))


def on_both_databases(metafunc) -> bool:
    module = metafunc.module
    if metafunc.definition.get_closest_marker("sqlite_only"):
        return False
    if metafunc.definition.get_closest_marker("on_both_databases"):
        return True
    if getattr(module, "SQLITE_ONLY", None):
        return False
    if getattr(module, "ON_BOTH_DATABASES", False):
        return True
    return Path(module.__file__).resolve().relative_to(TESTS).parts[0] in ON_BOTH_DATABASES_IN


def pytest_generate_tests(metafunc):
    """A test that reaches the `backend` fixture (through `db_url`, `controller`, `controller_db`, ...) runs once
    on each database where its module runs on both; parametrized per module, so module fixtures follow it."""
    if "backend" in metafunc.fixturenames and on_both_databases(metafunc):
        metafunc.parametrize("backend", BOTH_DATABASES, indirect=True, scope="module")


@pytest.fixture(scope="module")
def backend(request) -> str:
    """The database the test's store lives in: "sqlite" unless parametrized to "postgres"."""
    return getattr(request, "param", "sqlite")


@pytest.fixture(scope="session")
def postgres():
    """A real Postgres server for the whole test session (Debian's postgresql package); one per xdist worker."""
    from postgres_server import PostgresServer, find_binaries

    bin_dir = find_binaries()
    if bin_dir is None:
        reason = "Postgres is not installed: no /usr/lib/postgresql/*/bin/initdb (apt-get install postgresql)"
        if os.environ.get(REQUIRE_POSTGRES):
            pytest.fail(f"{reason}; {REQUIRE_POSTGRES} is set, so the Postgres tests must run", pytrace=False)
        pytest.skip(reason)
    server = PostgresServer(bin_dir).start()
    yield server
    server.stop()


@contextmanager
def postgres_database(request, migrated: bool = True) -> Iterator[str]:
    """A new database on the session's Postgres server (``migrated`` or empty), dropped when done."""
    server = request.getfixturevalue("postgres")
    url = server.new_database(migrated=migrated)
    try:
        yield url
    finally:
        server.drop_database(url)


@pytest.fixture
def db_url(request, backend: str, tmp_path: Path) -> Iterator[str]:
    """A fresh database of the test's backend: SQLite in the test's folder (empty), a new database on the
    Postgres server (already migrated: open_database finds nothing left to apply)."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'state.db'}"
        return
    with postgres_database(request) as url:
        yield url


@pytest.fixture
def empty_db_url(request, backend: str, tmp_path: Path) -> Iterator[str]:
    """Like `db_url`, but empty on Postgres too: for tests of the migrations themselves."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'state.db'}"
        return
    with postgres_database(request, migrated=False) as url:
        yield url


# A thread a test started may still be finishing its last piece of work when the test ends: it gets this long.
THREAD_GRACE_S = 10.0


@pytest.fixture(autouse=True)
def _no_thread_left_running():
    """A test must not leave a non-daemon thread of its own running: such a thread goes on into the next tests
    (one drawing from Python's global ``random`` once changed another test's reference run) and keeps the
    interpreter from exiting. Threads that end within THREAD_GRACE_S of the test's end are waited for."""
    before = set(threading.enumerate())
    yield
    left = [t for t in threading.enumerate() if t not in before and not t.daemon and t.is_alive()]
    deadline = time.monotonic() + THREAD_GRACE_S
    for thread in left:
        thread.join(max(0.0, deadline - time.monotonic()))
    running = [thread.name for thread in left if thread.is_alive()]
    if running:
        pytest.fail(f"the test left non-daemon threads running: {', '.join(running)}; join them, or make them "
                    "daemons that end with the test", pytrace=False)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    (path / "config.yaml").write_text(yaml.safe_dump({"clouds": {"local": {"time_scale": 0.05}}}))
    yield path
    kill_nodes(path)


@pytest.fixture
def runner(home: Path) -> Runner:
    return Runner(home)


def _controller_database(request, backend: str) -> Iterator[str | None]:
    if backend == "sqlite":
        yield None
        return
    with postgres_database(request) as url:
        yield url


@pytest.fixture
def controller_db(request, backend: str) -> Iterator[str | None]:
    """The `controller` fixture's --db: None (SQLite in its home) or a new Postgres database."""
    yield from _controller_database(request, backend)


@pytest.fixture(scope="module")
def module_controller_db(request, backend: str) -> Iterator[str | None]:
    """`controller_db` for a controller that a module's tests share."""
    yield from _controller_database(request, backend)


@pytest.fixture
def controller(home: Path, runner: Runner, controller_db: str | None):
    ctl = Controller(home, db_url=controller_db).start()
    runner.env.update({"RUNNER_SERVER": ctl.url, "RUNNER_TOKEN": ctl.token})
    yield ctl
    ctl.stop()
    kill_nodes(home)


def write_job(folder: Path, text: str, files: dict[str, str] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in (files or {}).items():
        (folder / name).write_text(content)
    path = folder / "job.yaml"
    path.write_text(text)
    return path


SLEEPER = """
name: sleeper
run: sleep 600
resources: {cloud: [local]}
recovery: {resume_drill: "off"}
"""


@contextmanager
def controller_with_a_sleeping_job(folder: Path, db_url: str | None = None,
                                   env: dict[str, str] | None = None) -> Iterator[SimpleNamespace]:
    """A controller under ``folder`` (its --db: ``db_url``) with one RUNNING job that never trains (with ``env``), for
    tests that speak for its agent: ``controller``, ``runner``, ``job_id``, ``home`` and ``node_headers`` (its node's
    token)."""
    home = folder / "home"
    home.mkdir()
    (home / "config.yaml").write_text(yaml.safe_dump({"clouds": {"local": {"time_scale": 0.05}}}))
    controller = Controller(home, db_url=db_url).start()
    runner = Runner(home)
    runner.env.update({"RUNNER_SERVER": controller.url, "RUNNER_TOKEN": controller.token})
    try:
        job = SLEEPER + (yaml.safe_dump({"env": env}) if env else "")
        job_id = runner.json("submit", str(write_job(folder / "job", job)))["id"]
        runner.wait_for(job_id, lambda j: j["state"] == "RUNNING", what="running")
        node = runner.json("status", job_id)["current_attempt"]["node"]
        token = next(yaml.safe_load(c.read_text())["token"] for c in home.glob("nodes/*/agent.yaml")
                     if yaml.safe_load(c.read_text())["node_id"] == node)
        yield SimpleNamespace(controller=controller, runner=runner, job_id=job_id, home=home,
                              node_headers={"Authorization": f"Bearer {token}"})
    finally:
        controller.stop()
        kill_nodes(home)


def controller_store_url(home: Path, db_url: str | None) -> str:
    """The database a test `Controller` in ``home`` keeps its state in: ``db_url``, or SQLite in its home."""
    return db_url or f"sqlite:///{home / 'runner.db'}"
