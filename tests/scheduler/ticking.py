"""Driving the reconciler when its cloud calls run on threads: every tick must come back, answers come later."""

from __future__ import annotations

import threading
import time

PATIENCE = 60.0  # seconds: an overall bound on waiting for an event, never an expected duration


def tick_returns(world) -> bool:
    """Run one tick on a thread of its own; whether it came back (a tick stuck on a cloud call never does)."""
    done = threading.Event()
    errors: list[BaseException] = []

    def run():
        try:
            world.tick()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
        done.set()

    threading.Thread(target=run, daemon=True).start()
    came_back = done.wait(PATIENCE)
    assert not errors, errors
    return came_back


def tick_until(world, condition, what: str) -> None:
    """Tick (each tick coming back) until ``condition()`` holds; answers arrive on their own threads."""
    deadline = time.monotonic() + PATIENCE
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        assert tick_returns(world), "a tick waited on a cloud call"
        world.ctx.nudge.wait(0.05)
        world.ctx.nudge.clear()


def start_jobs(world, *names: str) -> list[str]:
    """Submit a job per name, tick until each has its node, and register each node's agent (RUNNING)."""
    jobs = [world.submit(name=name) for name in names]
    tick_until(world, lambda: all(world.store.job(j).state == "PROVISIONING" for j in jobs), f"{names} to launch")
    for job_id in jobs:
        world.register(job_id)
    return jobs
