"""Steps run at the same time, each in a thread of its own, for the tests of races the controller's serialized writes
must decide: one step waits inside a patched read (it knows itself by its thread's name) while the other writes."""

from __future__ import annotations

import threading
from typing import Callable


def run_together(within_s: float = 60.0, **steps: Callable[[], None]) -> None:
    """Run each step in a thread named after its keyword, wait for all, and fail with what any step raised (a step
    that must wake the other whatever happens sets its event in a ``finally`` of its own)."""
    errors: list[BaseException] = []

    def guarded(step: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                step()
            except BaseException as exc:  # noqa: BLE001 - the test fails on it below
                errors.append(exc)
        return run

    threads = [threading.Thread(target=guarded(step), name=name) for name, step in steps.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(within_s)
    assert not errors, errors
    assert not [t.name for t in threads if t.is_alive()], "a step did not end"
