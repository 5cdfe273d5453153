"""The training's telemetry, relayed to the controller (docs/restart-log.md).

Every training process on the node sends its own ``telemetry`` (runner/checkpoint/telemetry.py). Under
torchrun that is one per local rank, so the relay folds them into one report per node: the steps, steps/s
and NaN steps of global rank 0 (the ranks train the same steps; a node without rank 0 leaves them out),
with the time of its first and last step (the ledger's gap between attempts), the largest peak memory of
the node's ranks (the controller keeps the largest over the nodes) and the slowest of their restores. It
forwards when local rank 0 (or a single process) reports, and when any rank sends its final report, so the
node posts about as often as one process reports.
"""

from __future__ import annotations

STEP_FIELDS = ("steps", "steps_per_second", "nan_steps")
# The ledger's step timing (unix seconds), of rank 0 too; forwarded only by a library that sends them.
STEP_TIMING_FIELDS = ("first_step", "first_step_at", "last_step", "last_step_at")


class TelemetryRelay:
    def __init__(self) -> None:
        self._peaks: dict[tuple, int] = {}  # (attempt, pid) -> the newest peak memory in bytes of that process
        self._restores: dict[tuple, float] = {}  # (attempt, pid) -> how long that process's restore() took
        self._lead: dict = {}  # attempt -> the newest step fields of global rank 0 (or the single process)

    def update(self, message: dict) -> dict | None:
        """Take one process's report; return the node's report to post now, or None."""
        attempt = message.get("attempt")
        peak = message.get("peak_memory_bytes")
        if isinstance(peak, int) and not isinstance(peak, bool):
            self._peaks[(attempt, message.get("pid"))] = peak
        restore = message.get("restore_seconds")
        if isinstance(restore, (int, float)) and not isinstance(restore, bool):
            self._restores[(attempt, message.get("pid"))] = float(restore)
        if message.get("rank") in (None, 0):
            self._lead[attempt] = {key: message.get(key) for key in STEP_FIELDS}
            self._lead[attempt].update({key: message[key] for key in STEP_TIMING_FIELDS if key in message})
        if message.get("local_rank") not in (None, 0) and not message.get("final"):
            return None
        peaks = [value for (of, _), value in self._peaks.items() if of == attempt]
        restores = [value for (of, _), value in self._restores.items() if of == attempt]
        report = {**self._lead.get(attempt, {}), "peak_memory_bytes": max(peaks) if peaks else None,
                  "memory": message.get("memory")}
        if restores:
            report["restore_seconds"] = max(restores)
        return report
