"""Postgres out of reach while a controller runs a job (a proxy in front of it closes every connection): the
CLI is told the database cannot be reached, naming it, instead of a bare 500; the controller logs the cause in
plain lines (no traceback), leads again once it is back, and the job's output and exit, sent meanwhile, are
stored: every line once, in order, and the job SUCCEEDED. A controller stopped while the database is away stops
at once, saying what it could not write, and the next controller on the database gets it all from the nodes."""

from __future__ import annotations

import json
import re
import sys
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlparse

import requests
import yaml

from conftest import Controller, Runner, kill_nodes, write_job
from polling import eventually

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fakes"))
from tcp_proxy import StallingProxy  # noqa: E402

LINES = 40
JOB = """
name: ticking
run: for i in $(seq 1 {lines}); do echo "line $i"; sleep 0.2; if [ $i = 10 ]; then while [ ! -e {go} ]; do sleep 0.1; done; fi; done
resources: {{cloud: [local]}}
recovery: {{max_preemptions: 0, max_failures: 0, resume_drill: "off"}}
"""


def _leads(ctl: Controller) -> bool | None:
    try:
        return requests.get(ctl.url + "/healthz", timeout=2).json().get("leader")
    except (requests.RequestException, ValueError):
        return None


def _logged(home: Path) -> list[dict]:
    return [json.loads(line) for line in (home / "controller.jsonl").read_text().splitlines() if line.strip()]


def _proxied(postgres) -> tuple[StallingProxy, str]:
    """A new database behind a proxy; the proxy and the database's URL through it."""
    db = urlparse(postgres.new_database())
    proxy = StallingProxy(("127.0.0.1", db.port))
    return proxy, db._replace(netloc=f"{db.username}:{db.password}@127.0.0.1:{proxy.port}").geturl()


@contextmanager
def _job_ending_while_the_database_is_away(tmp_path: Path, postgres):
    """A controller on a database behind a proxy runs the ticking job to its line 10; then the proxy is cut, the
    controller stands down, and the job prints the rest of its lines and exits while the database is away. Yields
    the run (``ctl`` may be replaced by the test); stops whatever controller and nodes are left, and the proxy."""
    proxy, db_url = _proxied(postgres)
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(yaml.safe_dump({"clouds": {"local": {"time_scale": 0.05}}}))
    run = SimpleNamespace(proxy=proxy, db_url=db_url, home=home, ctl=Controller(home, db_url=db_url), cli=Runner(home))
    try:
        run.ctl.start()
        run.cli.env.update({"RUNNER_SERVER": run.ctl.url, "RUNNER_TOKEN": run.ctl.token})
        go = tmp_path / "go"
        run.job_id = run.cli.json("submit", str(write_job(tmp_path / "job", JOB.format(lines=LINES, go=go))))["id"]
        run.cli.wait_for_output(run.job_id, r"^line 10$", timeout=180)
        proxy.cut()
        eventually(lambda: _leads(run.ctl) is False, "the controller to stand down", timeout=120.0, every=0.1)
        go.touch()  # the job prints the rest of its lines, and exits, while the database is away
        eventually(lambda: any(f"line {LINES}\n" in p.read_text() for p in home.glob("nodes/**/job.log")),
                   "the job's last line on its node", timeout=120.0, every=0.1)
        yield run
    finally:
        run.ctl.stop()
        kill_nodes(home)
        proxy.close()


def _every_line_once_and_succeeded(run) -> None:
    job = run.cli.wait_for(run.job_id, lambda j: j["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"), timeout=240,
                           what="the end of the job")
    assert job["state"] == "SUCCEEDED" and job["attempts"] == 1, job
    assert [int(n) for n in re.findall(r"^line (\d+)$", run.cli("logs", run.job_id).stdout, re.M)] == \
        list(range(1, LINES + 1))


def test_output_printed_while_the_database_is_out_of_reach_is_stored_once_in_order(tmp_path, postgres):
    with _job_ending_while_the_database_is_away(tmp_path, postgres) as run:
        during = run.cli("status", run.job_id)
        assert during.returncode != 0 and "Traceback" not in during.stderr
        assert f"the database at 127.0.0.1:{run.proxy.port}/" in during.stderr and \
            "cannot be reached" in during.stderr, during.stderr
        run.proxy.mend()
        eventually(lambda: _leads(run.ctl) is True, "the controller to lead again", timeout=120.0, every=0.1)
        _every_line_once_and_succeeded(run)
    logged = _logged(run.home)
    tracebacks = [line for line in logged if "exception" in line]
    assert not tracebacks, tracebacks[:2]  # the cause is said plainly, once a line
    assert any("the database cannot be reached" in line.get("event", "") for line in logged)


def test_a_controller_stopped_while_the_database_is_away_stops_at_once_and_the_next_one_gets_every_report(
        tmp_path, postgres):
    with _job_ending_while_the_database_is_away(tmp_path, postgres) as run:
        port = urlparse(run.ctl.url).port
        run.ctl.stop()  # SIGTERM; the helper waits a while for the exit, and fails where it does not come
        assert run.ctl.process.returncode == 0, run.ctl.process.stdout.read().decode()[-3000:]
        stopping = [line for line in _logged(run.home) if line.get("event", "").startswith("stopping")]
        assert any("the database cannot be reached" in line["event"] and "nodes report again" in line["event"]
                   for line in stopping), stopping
        run.proxy.mend()
        run.ctl = Controller(run.home, db_url=run.db_url).start(port=port)  # where the nodes send their reports
        _every_line_once_and_succeeded(run)
    tracebacks = [line for line in _logged(run.home) if "exception" in line]
    assert not tracebacks, tracebacks[:2]
