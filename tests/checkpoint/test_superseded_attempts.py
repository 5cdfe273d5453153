"""Attempts of one job share its durable folder. An attempt the runner has already replaced (it ignores
``should_stop``, or it was cut off and never heard) must not destroy what the next attempts resume from.

Each attempt is a real process (hostile_trainee.py) on its own local folder (its own node), all on one
``file://`` durable folder, with the variables the agent gives them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from .conftest import RUNNER_VARS

HOSTILE = Path(__file__).with_name("hostile_trainee.py")
PATIENCE_S = 300.0  # for one line of output: three torch processes share a busy machine
pytestmark = pytest.mark.timeout(1200)


class Attempt:
    """One attempt's training process, its output lines collected as they come."""

    def __init__(self, work: Path, attempt: int, durable: Path, resume_step: int | None = None, keep: int = 2,
                 ignore_stop: bool = False) -> None:
        self.until = work / f"stop-{attempt}"
        env = {k: v for k, v in os.environ.items() if k not in RUNNER_VARS and k != "RUNNER_RESUME_STEP"}
        env.update({"RUNNER_JOB_ID": "job-1", "RUNNER_ATTEMPT": str(attempt), "PYTHONHASHSEED": "0"})
        if resume_step is not None:
            env["RUNNER_RESUME_STEP"] = str(resume_step)
        args = [sys.executable, str(HOSTILE), "--local-dir", str(work / f"node-{attempt}"),
                "--durable-url", f"file://{durable}", "--keep", str(keep), "--until", str(self.until)]
        self.proc = subprocess.Popen(args + (["--ignore-stop"] if ignore_stop else []), env=env, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.lines: list[str] = []
        self.errors: list[str] = []
        self._changed = threading.Condition()
        for stream, into in ((self.proc.stdout, self.lines), (self.proc.stderr, self.errors)):
            threading.Thread(target=self._collect, args=(stream, into), daemon=True).start()

    def _collect(self, stream, into: list[str]) -> None:
        for line in stream:
            with self._changed:
                into.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            into.append("<eof>")
            self._changed.notify_all()

    def wait_for(self, predicate, what: str) -> str:
        """The first output line that satisfies ``predicate`` (waiting for it)."""
        with self._changed:
            ok = self._changed.wait_for(lambda: any(predicate(l) for l in self.lines) or "<eof>" in self.lines,
                                        PATIENCE_S)
            found = next((l for l in self.lines if predicate(l)), None)
        assert ok and found is not None, f"{what}: not seen; output {self.lines[-10:]}; log {self.errors[-15:]}"
        return found

    def number(self, word: str, at_least: int = 0) -> int:
        line = self.wait_for(lambda l: l.startswith(word + " ") and int(l.split()[1]) >= at_least,
                             f"'{word} N' with N >= {at_least}")
        return int(line.split()[1])

    def last_saved(self) -> int:
        with self._changed:
            return max(int(l.split()[1]) for l in self.lines if l.startswith("saved "))

    def finish(self) -> None:
        self.until.touch()
        try:
            self.proc.wait(PATIENCE_S)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        assert self.proc.returncode == 0, self.errors[-20:]


def committed(durable: Path) -> dict[int, int | None]:
    """step -> the attempt that committed it, for every committed checkpoint of the durable folder."""
    out = {}
    for manifest in durable.glob("step-*/manifest.json"):
        out[int(manifest.parent.name.split("-")[1])] = json.loads(manifest.read_text()).get("attempt")
    return out


def test_an_attempt_that_ignores_should_stop_cannot_destroy_the_handed_over_checkpoint(tmp_path):
    """Attempt 1 takes its emergency checkpoint (SIGTERM counts as a notice) and goes on saving at every step
    after the next attempt started. Attempt 2 resumes from the handed-over step, and attempt 3 from attempt 2's
    last commit: nothing is lost and nothing restarts from step 0."""
    durable = tmp_path / "durable"
    old = Attempt(tmp_path, 1, durable, ignore_stop=True)
    new = None
    try:
        old.number("saved", at_least=3)
        old.proc.send_signal(signal.SIGTERM)
        handed_over = old.number("stopping")
        new = Attempt(tmp_path, 2, durable, resume_step=handed_over)
        assert new.number("ready") == handed_over
        after_stop = old.number("saved", at_least=handed_over + 8)  # the old loop goes on saving
        reached = new.number("saved", at_least=handed_over + 3)
        assert after_stop >= handed_over + 8 and reached >= handed_over + 3
        old.finish()
        new.finish()
        last = new.last_saved()
        assert any("save() after should_stop is ignored" in l for l in old.lines + old.errors), old.lines[-10:]
    finally:
        for attempt in (old, new):
            if attempt is not None and attempt.proc.poll() is None:
                attempt.proc.kill()
    by_attempt = committed(durable)
    assert not [s for s, a in by_attempt.items() if a == 1 and s > handed_over], by_attempt
    assert by_attempt.get(last) == 2, by_attempt
    third = Attempt(tmp_path, 3, durable, resume_step=last)
    assert third.number("ready") == last
    third.finish()


def test_an_attempt_cut_off_from_the_runner_stops_committing_once_a_newer_one_started(tmp_path):
    """Attempt 1 never hears that it was replaced and keeps saving (keep: a million, so it prunes nothing itself
    however many steps it runs while attempt 2 starts). Attempt 2 (keep: 2) marks the folder at start: attempt 1 commits nothing more, attempt 2's retention is
    not undone, and attempt 3 resumes from attempt 2's last commit."""
    durable = tmp_path / "durable"
    old = Attempt(tmp_path, 1, durable, keep=10**6)
    new = None
    try:
        known = old.number("saved", at_least=3)  # what the controller last heard of, say
        new = Attempt(tmp_path, 2, durable, resume_step=known)
        assert new.number("ready") == known, new.errors
        seen_marker = old.number("saved", at_least=old.last_saved() + 8)
        reached = new.number("saved", at_least=known + 4)
        old.finish()
        new.finish()
        last = new.last_saved()
        assert seen_marker and reached
        assert any("a newer attempt of this job has started" in l for l in old.lines + old.errors), old.lines[-10:]
    finally:
        for attempt in (old, new):
            if attempt is not None and attempt.proc.poll() is None:
                attempt.proc.kill()
    by_attempt = committed(durable)
    # at most one commit of attempt 1 was past its check when attempt 2 marked the folder; attempt 2 removed it
    assert not [s for s, a in by_attempt.items() if a == 1 and s > known], by_attempt
    assert by_attempt.get(last) == 2 and known in by_attempt, by_attempt
    third = Attempt(tmp_path, 3, durable, resume_step=last)
    assert third.number("ready") == last
    third.finish()
