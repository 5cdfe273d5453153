"""Rendering a job's page from the store: what it shows, and that nothing from a job becomes markup."""

from __future__ import annotations

import json
import re
import time
from html.parser import HTMLParser

import pytest

from runner.state import Store, ledger, open_database
from runner.state.gangs import GangStore
from runner.web import render, views
from stored import job_spec, offer as make_offer

HOSTILE = "<script>document.title='pwned'</script><img src=x onerror=alert(1)>'\""


class Tags(HTMLParser):
    """Every start tag of a document, with its attributes."""

    def __init__(self, text: str):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


@pytest.fixture
def store(db_url) -> Store:
    return Store(open_database(db_url))


def _job(store: Store, zone: str = "local-a", message: str | None = None) -> dict:
    now = time.time() - 60
    offer = make_offer(zone=zone, instance_type="sim-t4")
    with store.db.transaction() as tx:
        store.insert_job(tx, "web-1", "web", job_spec("web"), "RUNNING", now)
        store.insert_attempt(tx, "web-1", "n-1", offer, True, 0, now + 1)
        store.add_event(tx, "web-1", "notice", message or "aws terminate notice", attempt=1, now=now + 30)
    return {"id": "web-1", "name": "web", "state": "RUNNING", "message": message, "attempts": 1, "preemptions": 0,
            "step": 0, "cost_usd": 0.0012, "age_seconds": 60.0}


def _summary(store: Store, status: dict) -> str:
    return render.render("job_summary.html", **views.job_page(store, status))


def test_the_summary_shows_the_attempt_on_the_timeline_with_its_zone_and_the_cost(store):
    """The job's summary draws its attempt, labelled with its zone, its notice and its cost."""
    text = _summary(store, _job(store))
    tags = Tags(text).tags
    lanes = [attrs for tag, attrs in tags if tag == "g" and "lane" in attrs.get("class", "")]
    assert [(lane["data-attempt"], lane["data-reason"]) for lane in lanes] == [("1", "running")]
    assert "#1 local-a · sim-t4" in text and "$0.0012" in text
    assert any(tag == "path" and "notice" in attrs.get("class", "") for tag, attrs in tags)


def test_cost_per_1000_steps_and_throughput_show_only_when_the_status_has_them(store):
    """$/1000 steps and steps/s appear when the status knows them, and are hidden otherwise."""
    status = _job(store)
    bare = _summary(store, status)
    assert "fact-cost-per-1000" not in bare and "fact-steps-per-second" not in bare
    unknown = _summary(store, {**status, "cost_per_1000_steps": None, "steps_per_second": None})
    assert "fact-cost-per-1000" not in unknown and "fact-steps-per-second" not in unknown
    known = _summary(store, {**status, "cost_per_1000_steps": 0.0425, "steps_per_second": 12.5})
    assert "$0.0425" in known and "12.50 steps/s" in known


def test_nothing_from_a_job_becomes_markup(store):
    """A message, an event and a zone holding HTML come out as text; the log list stays one JSON attribute."""
    text = _summary(store, _job(store, zone=HOSTILE, message=HOSTILE))
    tags = Tags(text).tags
    assert not [tag for tag, _ in tags if tag in ("script", "img")]
    assert not any(name.startswith("on") for _, attrs in tags for name in attrs)
    assert "&lt;script&gt;" in text
    (data,) = [attrs for tag, attrs in tags if "summary-data" in attrs.get("class", "")]
    assert json.loads(data["data-logs"])[0]["label"] == f"attempt 1 · {HOSTILE} · running"


def test_a_missing_job_page_escapes_the_id_it_was_asked_for():
    """The 404 page names the id asked for, as text."""
    text = render.render("not_found.html", signed_in=True, job_id=HOSTILE)
    scripts = [attrs.get("src") for tag, attrs in Tags(text).tags if tag == "script"]
    assert scripts == ["/static/app.js"]  # the page's own, and nothing else
    assert not [tag for tag, _ in Tags(text).tags if tag == "img"]
    assert "No job &lt;script&gt;" in text


def test_the_drill_verdict_in_words():
    """The drill's verdict reads as passed, failed, skipped or under way."""
    def verdict(drill):
        return views.drill_verdict({"attempt": 1, "drill": drill})

    assert verdict({"passed": True, "checkpoint_step": 21, "resumed_step": 21, "seconds": 7.6}) == {
        "attempt": 1, "outcome": "passed",
        "detail": "the emergency checkpoint of step 21 was restored at step 21 in 7.6 s"}
    assert verdict({"passed": False, "message": "resumed at step 0, expected 21"})["outcome"] == "failed"
    assert verdict({"passed": None, "message": "no checkpoint library in the job"})["outcome"] == "skipped"
    assert verdict({"passed": None, "checkpoint_step": 5})["outcome"] == "under way"


def test_a_job_without_attempts_says_why_it_waits(store):
    """A job with no attempt yet says so, with its message, instead of an empty timeline."""
    with store.db.transaction() as tx:
        store.insert_job(tx, "web-2", "web", job_spec("web"), "PENDING", time.time())
    status = {"id": "web-2", "name": "web", "state": "PENDING", "message": "no capacity in any zone", "attempts": 0,
              "preemptions": 0, "step": 0, "cost_usd": 0.0, "age_seconds": 1.0}
    text = _summary(store, status)
    assert 'id="no-attempts"' in text and "no capacity in any zone" in text and "<svg" not in text


def test_a_multi_node_attempt_has_a_lane_and_a_log_per_node(store):
    """A gang's attempt has a lane and a log per node, each named by that node's own end."""
    now = time.time() - 60
    offer = make_offer(instance_type="sim-t4")
    gangs = GangStore(store)
    with store.db.transaction() as tx:
        store.insert_job(tx, "gang-1", "gang", job_spec("gang", resources={"num_nodes": 2}), "RUNNING", now)
        store.insert_attempt(tx, "gang-1", "n-0", offer, True, 0, now + 1, num_nodes=2)
        for rank in (0, 1):
            gangs.add(tx, "gang-1", 1, rank, f"n-{rank}", offer, True)
        gangs.set_end_reasons(tx, "gang-1", 1, {0: "kept", 1: "preempted"})
    status = {"id": "gang-1", "name": "gang", "state": "RUNNING", "message": None, "attempts": 1, "preemptions": 0,
              "step": 0, "cost_usd": 0.0, "age_seconds": 60.0}
    view = views.job_page(store, status)
    assert [(lane.label, lane.reason) for lane in view["timeline"].lanes] == [
        ("#1 node 0 · local-a · sim-t4", "kept"), ("#1 node 1 · local-a · sim-t4", "preempted")]
    assert [(s["node"], s["label"]) for s in view["logs"]] == [
        (0, "attempt 1 · node 0 · local-a · kept"), (1, "attempt 1 · node 1 · local-a · preempted")]


def test_the_summary_shows_the_goodput_and_each_attempts_gap_and_start_phases(store):
    """The goodput ratio and its parts in the facts; each row's gap and boot · setup · restore in the table."""
    status = {**_job(store), "goodput": {"paid_seconds": 600.0, "training_seconds": 450.0, "redone_seconds": 30.0,
                                         "ratio": 0.75}}
    with store.db.transaction() as tx:
        ledger.record_start_phase(tx, "web-1", 1, 0, "boot_seconds", 12.5, keep_first=True)
        ledger.record_start_phase(tx, "web-1", 1, 0, "setup_seconds", 3.0)
    text = _summary(store, status)
    assert re.search(r'id="fact-goodput">75.0 %<', text)
    assert re.search(r'id="fact-goodput-parts">10m · 7m · 30s<', text)
    assert "12.5 s · 3.0 s · -" in text  # boot · setup · restore (not reported yet)
    assert 'class="phase boot"' in text and 'class="phase setup"' in text
    bare = _summary(store, {**status, "goodput": {**status["goodput"], "ratio": None}})
    assert "fact-goodput" not in bare


def test_the_accelerator_alternatives_and_the_placement_figures_show(store):
    """A job with alternatives shows them, and the figures its last placement was decided on."""
    bare_status = _job(store)
    status = {**bare_status, "spec": {"resources": {"accelerators": ["L4:1", "T4:1"]}},
              "cost_policy": "L4 spot in local-b (sim-l4): $0.273/h at 46.1 steps/s estimated from sim-t4"}
    text = _summary(store, status)
    assert "L4:1 or T4:1" in text and "at 46.1 steps/s estimated from sim-t4" in text
    bare = _summary(store, bare_status)
    assert "fact-accelerators" not in bare and "cost-policy" not in bare
