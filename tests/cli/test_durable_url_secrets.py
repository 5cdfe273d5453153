"""A checkpoint.durable_url that carries a secret (here a token as a query parameter, which the local market's
durable tier keeps in its folder's name) is used as written, and shown everywhere with the secret as ``***``:
`runner status` (text and --json), the restart log, the job's output, the web page, the controller's and the
agent's logs."""

from __future__ import annotations

import requests

from conftest import Controller, kill_nodes, write_job

SECRET = "tok-7f3e91c2d5"
JOB = """
name: secret-bucket
run: python train.py
resources: {{cloud: [local]}}
checkpoint: {{durable_url: "{url}"}}
recovery: {{resume_drill: "off"}}
"""
# Step 1 reaches the durable tier; step 2 cannot (a file stands where its folder goes), so the library reports a
# failed upload, whose error names the durable folder; a fresh local tier then restores step 1 from the durable tier.
TRAIN = """
import pathlib, torch
from runner.checkpoint import Checkpointer
model = torch.nn.Linear(2, 2)
ckpt = Checkpointer(model=model)
ckpt.restore()
ckpt.save(1)
ckpt.wait()
pathlib.Path({root!r}, "step-00000002").write_text("not a folder")
ckpt.save(2)
ckpt.wait()
ckpt.close()
assert Checkpointer(model=model, local_dir="fresh").restore() == 1, "the durable tier should have step 1"
print("durable tier used")
"""


def _web_pages(runner, controller, job_id: str) -> str:
    link = runner("dashboard", "--no-open")
    assert link.returncode == 0, link.stderr
    browser = requests.Session()
    assert browser.get(link.stdout.strip(), timeout=10).status_code == 200
    pages = [browser.get(controller.url + path, timeout=10) for path in
             ("/", f"/jobs/{job_id}", "/ui/jobs", f"/ui/jobs/{job_id}/summary", f"/ui/jobs/{job_id}/logs?attempt=1")]
    assert all(page.status_code == 200 for page in pages), [page.status_code for page in pages]
    assert job_id in pages[2].text
    return "\n".join(page.text for page in pages)


def test_a_secret_in_the_durable_url_is_shown_nowhere(tmp_path, home, runner):
    """The job saves to and restores from its durable URL; status, restarts, logs, the web page and the controller's
    and agent's logs show the URL with ``token=***``, never the token."""
    root = tmp_path / f"durable?token={SECRET}"
    url = f"local-durable://{tmp_path}/durable?token={SECRET}"
    controller = Controller(home).start()
    runner.env.update({"RUNNER_SERVER": controller.url, "RUNNER_TOKEN": controller.token})
    try:
        job_id = runner.json("submit", str(write_job(tmp_path / "job", JOB.format(url=url),
                                                     {"train.py": TRAIN.format(root=str(root))})))["id"]
        done = runner.wait_for(job_id, lambda j: j["state"] in ("SUCCEEDED", "FAILED"), timeout=120, what="the end")
        output = runner("logs", job_id).stdout
        assert done["state"] == "SUCCEEDED" and "durable tier used" in output, output
        assert (root / "step-00000001" / "manifest.json").is_file()  # the URL was used as written
        status = runner.json("status", job_id)
        assert status["spec"]["checkpoint"]["durable_url"] == f"local-durable://{tmp_path}/durable?token=***"
        assert "step 2 not saved on the durable tier" in status["last_checkpoint_failure"]["message"]
        assert "token=***" in status["last_checkpoint_failure"]["message"]
        shown = {"status --json": str(status), "status": runner("status", job_id).stdout,
                 "restarts": runner("restarts", job_id, "--json").stdout, "logs": output,
                 "web": _web_pages(runner, controller, job_id)}
    finally:
        controller.stop()
        kill_nodes(home)
    controller.process.wait(20)
    shown["controller log"] = (home / "controller.jsonl").read_text() + controller.process.stdout.read().decode()
    shown["agent log"] = "".join(log.read_text(errors="replace") for name in ("agent.jsonl", "node.log")
                                 for log in home.glob(f"nodes/*/{name}"))
    assert "token=***" in shown["logs"] and "token=***" in shown["agent log"]
    assert [where for where, text in shown.items() if SECRET in text] == []
