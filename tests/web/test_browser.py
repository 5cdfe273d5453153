"""The web page in a real headless Chromium, against a real controller running a real job on the local provider:
sign in through the link `runner dashboard` prints, watch the job appear, open it after a preemption, see its two
attempts on the timeline, follow its logs; a browser that never signed in sees no job; a job's output that holds
markup stays text. Screenshots are kept in the test's temporary folder."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml

from browser import MISSING, chrome
from conftest import REPO, kill_nodes, write_job

pytestmark = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")
SQLITE_ONLY = "a real browser over the pages that test_render.py and test_signin.py check on both databases"

TRAIN = REPO / "examples" / "quickstart" / "train.py"
INJECTION = """<script>document.title="pwned"</script><img src=x onerror="document.title=42">"""
JOB = f"""
name: web-e2e
run: |
  echo '{INJECTION}'
  python train.py --steps 5000 --step-time 0.03 --log-every 10 --interval 1h
resources: {{cloud: [local]}}
checkpoint: {{interval: 1h}}
recovery: {{max_preemptions: 3, max_failures: 0, resume_drill: "off"}}
"""
STEP = re.compile(r"^step (\d+) ", re.M)
WAIT = 90  # seconds: an overall bound for each event awaited, never a sleep


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A less compressed clock than the unit tests' (as tests/e2e): an AWS notice leaves the job 24 s."""
    path = tmp_path / "home"
    path.mkdir()
    (path / "config.yaml").write_text(yaml.safe_dump({"clouds": {"local": {"time_scale": 0.2}}}))
    yield path
    kill_nodes(path)


@pytest.fixture
def browsers(tmp_path):
    """A factory of fresh headless browsers (each its own profile), all closed at the end."""
    opened = []

    def start(name: str):
        driver = chrome(tmp_path / f"profile-{name}")
        opened.append(driver)
        return driver

    yield start
    for driver in opened:
        driver.quit()


def _until(driver, condition, what: str, timeout: float = WAIT):
    from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.2,
                             ignored_exceptions=(StaleElementReferenceException,)).until(condition)
    except TimeoutException:
        raise AssertionError(f"timed out waiting for {what}; page: {driver.current_url}\n"
                             f"{driver.find_element('tag name', 'body').text[-3000:]}") from None


def _timeline_lanes(driver) -> list[tuple[str, str, bool]]:
    """Each lane of the job's timeline: (its end reason, its label, whether it marks a notice); [] until drawn."""
    from selenium.webdriver.common.by import By

    return [(lane.get_attribute("data-reason"),
             lane.find_element(By.CSS_SELECTOR, "text.lane-label").get_attribute("textContent"),
             bool(lane.find_elements(By.CSS_SELECTOR, "path.mark.notice")))
            for lane in driver.find_elements(By.CSS_SELECTOR, "svg.timeline g.lane")]


def _pane_text(driver, attempt: int) -> str:
    from selenium.webdriver.common.by import By

    panes = driver.find_elements(By.CSS_SELECTOR, f'.log-pane[data-attempt="{attempt}"] pre')
    return panes[0].get_attribute("textContent") if panes else ""


def _last_step(text: str) -> int:
    return max((int(s) for s in STEP.findall(text)), default=-1)


def test_sign_in_see_the_preempted_job_on_a_timeline_and_follow_its_logs(tmp_path, runner, controller, browsers):
    from selenium.webdriver.common.by import By

    # Sign in through the printed link: the code leaves the address bar, and the (empty) jobs list shows.
    url = runner("dashboard", "--no-open").stdout.strip()
    base = url.split("/signin")[0]
    signed_in = browsers("signed-in")
    signed_in.get(url)
    assert signed_in.current_url == base + "/"
    _until(signed_in, lambda d: "No jobs yet" in d.find_element(By.ID, "jobs-body").text, "the empty state")

    # A job submitted now appears in the open page without a reload.
    folder = tmp_path / "job"
    folder.mkdir()
    shutil.copy(TRAIN, folder / "train.py")
    job_id = runner.json("submit", str(write_job(folder, JOB)))["id"]
    try:
        row_text = _until(signed_in, lambda d: d.find_element(By.CSS_SELECTOR, f'tr[data-job="{job_id}"]').text,
                          "the job's row")
        assert "web-e2e" in row_text
        signed_in.save_screenshot(str(tmp_path / "jobs.png"))

        # Preempted once: a notice through the node's metadata server, then the job resumes elsewhere.
        runner.wait_for_output(job_id, r"^step 20 ", timeout=WAIT)
        assert runner("preempt", job_id, "--notice", "aws").returncode == 0
        runner.wait_for(job_id, lambda j: j["attempts"] == 2 and j["state"] == "RUNNING", timeout=WAIT,
                        what="the second attempt")
        first, second = runner.json("restarts", job_id)
        assert first["end_reason"] == "preempted"

        # The job's page: one bar per attempt, labelled with its zone, coloured by how it ended.
        # (the list re-renders as the job's state changes: an element found a moment ago may be gone, so the
        # click and the timeline's reading are retried whole until they run on one rendering)
        _until(signed_in, lambda d: d.find_element(By.CSS_SELECTOR, f'tr[data-job="{job_id}"] a').click() or True,
               "the job's link clicked")
        lanes = _until(signed_in, _timeline_lanes, "the timeline")
        assert [reason for reason, _, _ in lanes] == ["preempted", "running"]
        assert [label for _, label, _ in lanes] == [f"#1 {first['zone']} · {first['instance_type']}",
                                                   f"#2 {second['zone']} · {second['instance_type']}"]
        assert first["zone"] != second["zone"]
        assert lanes[0][2]  # a mark where the notice came

        # Every attempt's logs; following shows new output as it comes, without reloading the page.
        _until(signed_in, lambda d: "stopping at step" in _pane_text(d, 1), "attempt 1's output")
        assert INJECTION in _pane_text(signed_in, 1)  # the markup it printed, as text
        signed_in.execute_script("window.notReloaded = true")
        signed_in.find_element(By.ID, "follow").click()
        _until(signed_in, lambda d: _last_step(_pane_text(d, 2)) >= 0, "attempt 2's first step")
        before = _last_step(_pane_text(signed_in, 2))
        _until(signed_in, lambda d: _last_step(_pane_text(d, 2)) > before, f"a step after {before}")
        assert "resumed from step" in _pane_text(signed_in, 2)
        assert signed_in.execute_script("return window.notReloaded") is True

        # Nothing the job printed ran: no element but the page's own script, no CSP violation reported.
        assert "pwned" not in signed_in.title and signed_in.title == "runner: web-e2e (RUNNING)"
        scripts = [s.get_attribute("src") for s in signed_in.find_elements(By.TAG_NAME, "script")]
        assert scripts == [base + "/static/app.js"]
        assert not signed_in.find_elements(By.TAG_NAME, "img")
        console = " ".join(entry["message"] for entry in signed_in.get_log("browser"))
        assert "Content Security Policy" not in console, console
        signed_in.save_screenshot(str(tmp_path / "job-page.png"))

        # A browser that never signed in sees no job, on either page.
        stranger = browsers("stranger")
        for page in ("/", f"/jobs/{job_id}"):
            stranger.get(base + page)
            assert stranger.find_elements(By.ID, "signed-out"), page
            assert job_id not in stranger.page_source and "web-e2e" not in stranger.page_source
        stranger.save_screenshot(str(tmp_path / "signed-out.png"))
    finally:
        runner("cancel", job_id)
