"""A token written as a URL's user name, with no password (``memory://TOKEN@bucket/...`` as a durable URL,
``http://TOKEN@host:port`` as the controller's URL), is a secret like a password: `runner status` (text and
--json), the restart log, the web page, the controller's and the agent's logs and the CLI's errors show it as
``***``. Where the scheme makes the user an account's name (``sftp://trainer@host``) it is shown as written:
tests/protocol/test_url_redaction.py."""

from __future__ import annotations

import socket

from conftest import Controller, Runner, kill_nodes, write_job
from test_durable_url_secrets import _web_pages

DURABLE_TOKEN = "ghp_4d1b7e9a0c2f63d8"
CONTROLLER_TOKEN = "ghp_93c7a1e05b4d2f86"
JOB = """
name: token-user
run: echo done
resources: {{cloud: [local]}}
checkpoint: {{durable_url: "{url}"}}
recovery: {{resume_drill: "off"}}
"""


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_token_written_as_a_durable_urls_user_is_shown_nowhere(tmp_path, home, runner):
    url = f"memory://{DURABLE_TOKEN}@bucket/ckpt"
    controller = Controller(home).start()
    runner.env.update({"RUNNER_SERVER": controller.url, "RUNNER_TOKEN": controller.token})
    try:
        job_id = runner.json("submit", str(write_job(tmp_path / "job", JOB.format(url=url))))["id"]
        done = runner.wait_for(job_id, lambda j: j["state"] in ("SUCCEEDED", "FAILED"), timeout=120, what="the end")
        assert done["state"] == "SUCCEEDED", done
        status = runner.json("status", job_id)
        assert status["spec"]["checkpoint"]["durable_url"] == "memory://***@bucket/ckpt"
        shown = {"status --json": str(status), "status": runner("status", job_id).stdout,
                 "restarts": runner("restarts", job_id, "--json").stdout, "logs": runner("logs", job_id).stdout,
                 "web": _web_pages(runner, controller, job_id)}
    finally:
        controller.stop()
        kill_nodes(home)
    shown["controller log"] = (home / "controller.jsonl").read_text() + controller.process.stdout.read().decode()
    shown["agent log"] = "".join(log.read_text(errors="replace") for name in ("agent.jsonl", "node.log")
                                 for log in home.glob(f"nodes/*/{name}"))
    assert [where for where, text in shown.items() if DURABLE_TOKEN in text] == []


def test_a_token_written_as_the_controller_urls_user_is_not_repeated_by_the_cli(home):
    cli = Runner(home)
    port = _closed_port()
    cli.env.update({"RUNNER_SERVER": f"http://{CONTROLLER_TOKEN}@127.0.0.1:{port}", "RUNNER_TOKEN": "t"})
    answer = cli("jobs")
    assert answer.returncode == 3, answer
    assert f"the controller at http://***@127.0.0.1:{port}" in answer.stderr, answer.stderr
    assert CONTROLLER_TOKEN not in answer.stdout + answer.stderr
