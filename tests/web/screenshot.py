"""Take the README's screenshot of a job's page, with the browser setup of the tests.

    python tests/web/screenshot.py docs/images/job-page.png

A real controller on the local provider runs the quickstart's training with its resume drill, the job is
preempted once through AWS's notice protocol and resumes in another zone until it succeeds; then a headless
Chromium signs in through `runner dashboard --no-open` and photographs the job's page.
"""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from browser import MISSING, chrome  # noqa: E402
from conftest import REPO, Controller, Runner, kill_nodes, write_job  # noqa: E402

JOB = """
name: quickstart
run: python train.py --steps 500 --step-time 0.05 --log-every 50
resources: {cloud: [local]}
checkpoint: {interval: 4s, keep: 3}
recovery: {max_preemptions: 5, max_failures: 1, resume_drill: 5s}
"""


def _wait(what: str, condition, timeout: float = 180):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.3)
    raise SystemExit(f"timed out waiting for {what}")


def main(target: Path) -> None:
    if MISSING:
        raise SystemExit(MISSING)
    from selenium.webdriver.common.by import By

    work = Path(tempfile.mkdtemp(prefix="runner-screenshot-"))
    home = work / "home"
    home.mkdir()
    (home / "config.yaml").write_text(yaml.safe_dump({"clouds": {"local": {"time_scale": 0.2}}}))
    controller = Controller(home).start()
    runner = Runner(home)
    runner.env.update({"RUNNER_SERVER": controller.url, "RUNNER_TOKEN": controller.token})
    driver = None
    try:
        folder = work / "job"
        folder.mkdir()
        shutil.copy(REPO / "examples" / "quickstart" / "train.py", folder / "train.py")
        job_id = runner.json("submit", str(write_job(folder, JOB)))["id"]
        # After the drill, once the resumed attempt has trained a while: a notice, and a new zone.
        _wait("the resumed attempt's training", lambda: re.search(
            r"^step 200 ", runner("logs", job_id, "--attempt", "2").stdout, re.M))
        runner("preempt", job_id, "--notice", "aws")
        _wait("the end", lambda: runner.json("status", job_id)["state"] in ("SUCCEEDED", "FAILED"))

        driver = chrome(work / "profile", width=1280, height=1160)
        driver.get(runner("dashboard", "--no-open").stdout.strip())
        driver.get(f"{controller.url}/jobs/{job_id}")
        _wait("every log pane", lambda: len([p for p in driver.find_elements(By.CSS_SELECTOR, ".log-pane pre")
                                             if p.get_attribute("textContent")]) == 3)
        target.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(target))
        print(f"saved {target}")
    finally:
        if driver is not None:
            driver.quit()
        controller.stop()
        kill_nodes(home)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/images/job-page.png"))
