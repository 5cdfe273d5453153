"""Signing a browser in, over real HTTP to a real controller: one-time links, the session cookie, what a
page shows with and without it, and the headers that keep a page's content inert."""

from __future__ import annotations

import re
import stat
import sys
import time

import pytest
import requests
import yaml

from conftest import controller_with_a_sleeping_job
from runner.controller.auth import hash_token
from runner.state import Store, open_database, web_sessions
from runner.web import routes, sessions

SIGNIN = re.compile(r"^(http://127\.0\.0\.1:\d+)/signin\?code=[\w-]{40,}$")


def _link(runner) -> str:
    result = runner("dashboard", "--no-open")
    assert result.returncode == 0, result.stderr
    assert "works once, within 5 minutes" in result.stderr
    url = result.stdout.strip()
    assert SIGNIN.match(url), url
    return url


def _signed_in(runner) -> tuple[requests.Session, str]:
    url = _link(runner)
    browser = requests.Session()
    assert browser.get(url, timeout=10).status_code == 200
    return browser, SIGNIN.match(url).group(1)


@pytest.fixture(scope="module")
def site(tmp_path_factory, module_controller_db):
    """One controller for the module, with one running job: (controller, runner, job id, home)."""
    with controller_with_a_sleeping_job(tmp_path_factory.mktemp("web"), module_controller_db) as server:
        yield server.controller, server.runner, server.job_id, server.home


@pytest.fixture
def controller(site):
    return site[0]


@pytest.fixture
def runner(site):
    return site[1]


@pytest.fixture
def job_id(site):
    return site[2]


@pytest.fixture
def home(site):
    return site[3]


def test_a_link_signs_in_once_sets_a_safe_cookie_and_leaves_the_code_out_of_the_address(runner, controller, job_id):
    """The printed link signs in once, with an HttpOnly, SameSite, expiring cookie, and redirects to /."""
    url = _link(runner)
    first = requests.get(url, allow_redirects=False, timeout=10)
    assert first.status_code == 303 and first.headers["location"] == "/"
    cookie = first.headers["set-cookie"]
    assert cookie.startswith(f"{sessions.COOKIE}=")
    for attribute in ("HttpOnly", "SameSite=lax", "Max-Age=43200", "Path=/"):
        assert attribute in cookie
    assert "Secure" not in cookie  # plain http on loopback: a Secure cookie would never come back
    assert first.headers["cache-control"] == "no-store" and first.headers["referrer-policy"] == "no-referrer"

    browser = requests.Session()
    page = browser.get(url, timeout=10)  # follows the redirect: the address ends as /
    assert page.status_code == 400 and "cannot be used" in page.text  # the link was spent by the first visit
    assert job_id not in page.text

    browser.cookies.set(sessions.COOKIE, first.cookies[sessions.COOKIE])
    page = browser.get(controller.url + "/", timeout=10)
    assert page.url == controller.url + "/" and job_id in page.text and "sleeper" in page.text
    assert controller.token not in page.text
    assert job_id in browser.get(controller.url + "/ui/jobs", timeout=10).text


def test_without_a_session_no_page_shows_a_job_whatever_token_is_sent(home, runner, controller, job_id):
    node_token = next(yaml.safe_load(c.read_text())["token"] for c in home.glob("nodes/*/agent.yaml"))
    for headers in ({}, controller.headers(), controller.headers(node_token)):
        front = requests.get(controller.url + "/", headers=headers, timeout=10)
        assert front.status_code == 200 and 'id="signed-out"' in front.text and job_id not in front.text
        page = requests.get(f"{controller.url}/jobs/{job_id}", headers=headers, timeout=10)
        assert page.status_code == 401 and job_id not in page.text
        for path in ("/ui/jobs", f"/ui/jobs/{job_id}/summary", f"/ui/jobs/{job_id}/logs?attempt=1"):
            refused = requests.get(controller.url + path, headers=headers, timeout=10)
            assert refused.status_code == 401 and job_id not in refused.text, path
    forged = requests.get(controller.url + "/ui/jobs", cookies={sessions.COOKIE: "made-up"}, timeout=10)
    assert forged.status_code == 401


DATA_ROUTES = sorted(route.path for route in routes.router.routes if route.path.startswith("/ui/"))


@pytest.mark.parametrize("path", DATA_ROUTES)
def test_every_data_route_of_the_page_refuses_a_browser_without_a_session(controller, job_id, path):
    """Each route the page's script reads (present and future) answers 401 without a session."""
    response = requests.get(controller.url + path.replace("{job_id}", job_id), params={"attempt": 1}, timeout=10)
    assert response.status_code == 401 and job_id not in response.text


def test_only_the_admin_token_mints_a_link(home, controller, job_id):
    """Only the admin token can ask for a sign-in link; a node's token cannot."""
    node_token = next(yaml.safe_load(c.read_text())["token"] for c in home.glob("nodes/*/agent.yaml"))
    url = controller.url + "/v1/dashboard/links"
    assert requests.post(url, timeout=10).status_code == 401
    assert requests.post(url, headers=controller.headers("wrong"), timeout=10).status_code == 401
    assert requests.post(url, headers=controller.headers(node_token), timeout=10).status_code == 403
    minted = requests.post(url, headers=controller.headers(), timeout=10)
    assert minted.status_code == 201 and minted.json()["expires_in_seconds"] == sessions.LINK_SECONDS


def test_a_signed_in_page_shows_the_job_its_logs_and_a_404_for_an_unknown_job(runner, controller, job_id):
    """A session reads a job's page and logs; an unknown job gets a 404 page, a bad parameter a plain 422."""
    browser, base = _signed_in(runner)
    page = browser.get(f"{base}/jobs/{job_id}", timeout=10)
    assert page.status_code == 200 and 'data-reason="running"' in page.text and "local-" in page.text
    logs = browser.get(f"{base}/ui/jobs/{job_id}/logs", params={"attempt": 1}, timeout=10).json()
    assert logs["attempt"] == 1 and logs["complete"] is False
    bad = browser.get(f"{base}/ui/jobs/{job_id}/logs", params={"attempt": "one"}, timeout=10)
    assert bad.status_code == 422 and "attempt" in bad.json()["detail"]
    missing = browser.get(f"{base}/jobs/no-such-job", timeout=10)
    assert missing.status_code == 404 and "No job no-such-job" in missing.text
    assert browser.get(f"{base}/ui/jobs/no-such-job/summary", timeout=10).status_code == 404


@pytest.mark.parametrize("name", ["offset", "attempt", "node"])
def test_a_log_parameter_beyond_64_bits_is_422_as_in_the_api(runner, controller, job_id, name):
    """?offset=10**29 once overflowed SQLite behind the page (500); the page refuses it as the API does."""
    browser, base = _signed_in(runner)
    params = {"attempt": 1, name: 10**29}
    bad = browser.get(f"{base}/ui/jobs/{job_id}/logs", params=params, timeout=10)
    assert bad.status_code == 422 and name in bad.json()["detail"]
    api = requests.get(f"{controller.url}/v1/jobs/{job_id}/logs", params=params, headers=controller.headers(),
                       timeout=10)
    assert api.status_code == 422


def test_every_page_response_forbids_inline_script_framing_and_sniffing(runner, controller):
    """Every web response carries a CSP without inline script, frame-ancestors 'none' and nosniff."""
    browser, base = _signed_in(runner)
    for path in ("/", "/jobs/none", "/ui/jobs", "/ui/jobs/none/summary", "/signin?code=spent", "/static/app.js"):
        headers = browser.get(base + path, timeout=10).headers
        csp = headers["content-security-policy"]
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp, path
        assert headers["x-content-type-options"] == "nosniff", path
    assert requests.get(base + "/ui/jobs", timeout=10).headers["x-content-type-options"] == "nosniff"  # a 401 too


def test_the_package_serves_its_own_assets(controller):
    """The script, stylesheet and icon come from the package; nothing else is served as a static file."""
    for name, kind in (("app.js", "text/javascript"), ("style.css", "text/css"), ("icon.svg", "image/svg+xml")):
        response = requests.get(f"{controller.url}/static/{name}", timeout=10)
        assert response.status_code == 200 and response.headers["content-type"].startswith(kind) and response.content
    assert requests.get(f"{controller.url}/static/../admin-token", timeout=10).status_code == 404
    assert requests.get(f"{controller.url}/static/secret.txt", timeout=10).status_code == 404


def test_the_cookie_is_secure_behind_an_https_proxy(runner, controller):
    """Served over https (through a local proxy), the session cookie is Secure."""
    url = _link(runner)
    # uvicorn trusts X-Forwarded-Proto from loopback, where a TLS-terminating proxy would be.
    response = requests.get(url, headers={"X-Forwarded-Proto": "https"}, allow_redirects=False, timeout=10)
    assert response.status_code == 303 and "Secure" in response.headers["set-cookie"]


def test_signing_out_ends_the_session_and_another_site_cannot_sign_you_out(runner, controller):
    """Sign-out ends the session in the database; a sign-out posted from another site is refused."""
    browser, base = _signed_in(runner)
    assert browser.post(base + "/signout", headers={"Origin": "http://evil.example"}, timeout=10).status_code == 403
    assert browser.get(base + "/ui/jobs", timeout=10).status_code == 200
    secret = browser.cookies[sessions.COOKIE]
    out = browser.post(base + "/signout", headers={"Origin": base}, timeout=10)
    assert out.status_code == 200 and 'id="signed-out"' in out.text
    assert requests.get(base + "/ui/jobs", cookies={sessions.COOKIE: secret}, timeout=10).status_code == 401


def test_links_and_sessions_expire_and_only_their_hash_is_stored(db_url):
    """Links expire after minutes and sessions after hours; the database holds only their hashes."""
    store = Store(open_database(db_url))
    now = time.time()
    with store.db.transaction() as tx:
        web_sessions.add(tx, hash_token("link-code"), web_sessions.LINK, now, now + sessions.LINK_SECONDS)
        web_sessions.add(tx, hash_token("late-code"), web_sessions.LINK, now, now + sessions.LINK_SECONDS)
        web_sessions.add(tx, hash_token("session"), web_sessions.SESSION, now, now + sessions.SESSION_SECONDS)
    stored = {row["token_hash"] for row in store.db.query("SELECT token_hash FROM web_sessions")}
    assert not stored & {"link-code", "late-code", "session"}
    with store.db.transaction() as tx:
        assert not web_sessions.spend_link(tx, hash_token("late-code"), now + sessions.LINK_SECONDS + 1)
        assert not web_sessions.spend_link(tx, hash_token("session"), now)  # a session is not a link
        assert web_sessions.spend_link(tx, hash_token("link-code"), now + 1)
        assert not web_sessions.spend_link(tx, hash_token("link-code"), now + 2)
    assert web_sessions.session_expires_at(store.db, hash_token("session"), now + 3600) is not None
    assert web_sessions.session_expires_at(store.db, hash_token("session"), now + sessions.SESSION_SECONDS) is None
    assert web_sessions.session_expires_at(store.db, hash_token("link-code"), now) is None


def test_dashboard_opens_the_link_in_the_users_browser(tmp_path, runner, controller):
    """Without --no-open, runner dashboard hands the link to the user's browser ($BROWSER)."""
    opened = tmp_path / "opened.txt"
    browser = tmp_path / "browser.sh"
    browser.write_text(f"#!/bin/sh\necho \"$1\" > {opened}\n")
    browser.chmod(browser.stat().st_mode | stat.S_IXUSR)
    result = runner("dashboard", env={"BROWSER": str(browser)})
    assert result.returncode == 0, result.stderr
    deadline = time.monotonic() + 30
    while not opened.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert opened.read_text().strip() == result.stdout.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the no-display rule is for Linux")
def test_dashboard_without_a_display_prints_the_link_and_starts_no_console_browser(runner, controller):
    """On a Linux box without a display, the link is printed and no console browser is started."""
    env = {k: "" for k in ("DISPLAY", "WAYLAND_DISPLAY", "BROWSER")}
    result = runner("dashboard", env=env)
    assert result.returncode == 0 and SIGNIN.match(result.stdout.strip())
    assert "No graphical browser here" in result.stderr


def test_dashboard_without_a_controller_exits_3(runner):
    """With no controller to ask, runner dashboard says so and exits 3."""
    result = runner("dashboard", "--no-open", env={"RUNNER_SERVER": "http://127.0.0.1:9", "RUNNER_TOKEN": "x"})
    assert result.returncode == 3 and "cannot reach the controller" in result.stderr
    assert "Traceback" not in result.stderr
