"""A framework's own checkpoint folder (runner/integrations) committed like any save, in either mode.

The integration asks the Checkpointer's ``poll`` at which step to have the framework write its folder;
``incoming`` gives it an empty folder for those files, ``commit`` commits them (and on an emergency waits for
the durable tier and stops), ``restore`` finds the newest committed folder that verifies and that the
integration accepts. The requests, the agreement between ranks, the emergency and every message to the agent
are the Checkpointer's own.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from ..agreement import Decision
from ..control import describe_deadline
from ..folder_format import incoming_folder
from ..log import get_logger
from ..restore import Restored, restore_into

log = get_logger()


class FrameworkFolders:
    """The framework-folder half of one Checkpointer."""

    def __init__(self, checkpointer) -> None:
        self._ckpt = checkpointer
        self._restore_started: float | None = None  # monotonic: restore() began, report_restored() not yet

    def incoming(self, step: int) -> Path | None:
        mode = self._ckpt._mode
        mode.barrier()  # every rank wrote its files
        if not mode.folder_leader:
            return None
        folder = incoming_folder(self._ckpt.local.root, step)
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        return folder

    def commit(self, step: int, folder: Path | None, decision: Decision, payload: dict) -> None:
        ckpt = self._ckpt
        request = decision.request
        if request is not None:
            log.info("checkpoint requested", step=step, reason=request.reason, stop=request.stop,
                     origin=decision.origin, deadline=describe_deadline(request.deadline))
        job = ckpt._save(step, emergency=bool(request and request.stop), folder=folder, payload=payload)
        if request is not None and request.stop:
            ckpt._emergency(step, request, origin=decision.origin, job=job)

    def restore(self, check) -> Restored | None:
        ckpt = self._ckpt
        self._restore_started = time.monotonic()  # until report_restored(): the framework loads it in between
        ckpt._mode.drain()
        restored = restore_into(ckpt.local, ckpt.durable, ckpt._mode.comm, ckpt._mode.folder_leader, {}, {}, None,
                                max_step=ckpt._handed_over, apply_folder=check)
        ckpt._retention.restored(restored.step if restored is not None else None)
        ckpt._schedule.restart()
        return restored

    def report_restored(self, restored: Restored | None) -> None:
        ckpt = self._ckpt
        if self._restore_started is not None:
            ckpt.telemetry.restore_seconds = round(time.monotonic() - self._restore_started, 4)
            self._restore_started = None
        ckpt._report_restored(restored, ckpt._handed_over)
