"""Job telemetry from the training side (docs/restart-log.md): steps, steps/s, NaN steps, peak memory, the run
manifest, and the ledger's timings: the wall-clock time (unix seconds) of the attempt's first and last step and how
long ``restore()`` took.

``StepTelemetry`` is fed once per training step and reports to the agent over the control channel, batched:
at most one ``telemetry`` message every ``report_every_s`` seconds, one soon after each checkpoint commit
(``report_soon``), and an exact one at ``close()``. The run manifest goes once, after the first ``restore()``: it
is worked out in the background from the Checkpointer's construction (hashing the installed packages' list takes
up to 2 s on a busy node), and sent once it is ready, so it never lengthens the restore's pause.

A loss may be a Python float or a tensor on any device. Counting non-finite losses must not add a device sync
to the step, so a tensor loss is folded into a counter tensor on its own device with asynchronous ops; on
CUDA the counter is copied back to pinned host memory without blocking when a report is due, and read at
the next report once that copy has finished. Only ``close()`` waits for the exact value (the training is over).

Outside the runner ``control`` is None: counting still works (``nan_steps``, ``steps``), nothing is sent.
"""

from __future__ import annotations

import math
import resource
import sys
import threading
import time
from concurrent.futures import Future
from concurrent.futures import wait as futures_wait

from runner.protocol.messages import Manifest, Telemetry

from .log import get_logger

log = get_logger()

REPORT_EVERY_S = 5.0
MANIFEST_AT_CLOSE_S = 10.0  # close() waits this long at most for a manifest still being worked out


def _torch():
    """torch when the training imported it; telemetry never imports it (a float-only caller may not need it)."""
    return sys.modules.get("torch")


class _DeviceTally:
    """The tensor losses of one device: how many were counted, and a tensor there counting the finite ones."""

    def __init__(self, finite) -> None:
        self.finite = finite.to(dtype=_torch().int64)  # a copy: the caller's tensor is never written
        self.losses = 1  # host-side: how many losses went into ``finite``
        self.copy = None  # CUDA: (pinned host tensor, event, losses at the copy) of a read-back in flight
        self.nan = 0  # non-finite losses as of the last read-back

    def read(self) -> None:
        """Read the count back now (waits for the device: only where that is cheap or allowed)."""
        self.copy = None
        self.nan = self.losses - int(self.finite)

    def poll_cuda(self) -> None:
        """Take a finished read-back's value, and start the next one; never waits."""
        torch = _torch()
        if self.copy is not None:
            host, event, losses = self.copy
            if not event.query():
                return  # still in flight: the previous value stands
            self.nan = losses - int(host)
        else:
            host = torch.empty((), dtype=torch.int64, pin_memory=True)
        with torch.cuda.device(self.finite.device):
            host.copy_(self.finite, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
        self.copy = (host, event, self.losses)


class NonFiniteCounter:
    """Counts steps whose loss was NaN or inf; a tensor loss costs two asynchronous ops on its device.

    Per device it counts the *finite* losses in a tensor (``isfinite`` then an in-place add: no host read)
    and the losses on the host; NaN steps are the difference, known when the tensor is read back.
    """

    def __init__(self) -> None:
        self.seen = False  # was any loss reported at all (nan_steps is null otherwise)
        self._host = 0  # non-finite Python floats
        self._tallies: dict = {}  # device -> _DeviceTally

    def add(self, loss) -> None:
        """Count one step's loss; never waits for the device."""
        self.seen = True
        torch = _torch()
        if torch is not None and isinstance(loss, torch.Tensor):
            finite = torch.isfinite(loss) if loss.dim() == 0 else torch.isfinite(loss).all()
            tally = self._tallies.get(finite.device)
            if tally is None:
                self._tallies[finite.device] = _DeviceTally(finite)
            else:
                tally.finite.add_(finite)
                tally.losses += 1
            return
        try:
            value = float(loss)
        except (TypeError, ValueError):
            raise TypeError(f"step(loss=...): expected a float or a tensor, got {type(loss).__name__}") from None
        if not math.isfinite(value):
            self._host += 1

    def poll(self) -> int:
        """The newest count known without waiting: a CUDA tally's as of its last finished read-back."""
        for device, tally in self._tallies.items():
            if device.type == "cuda":
                tally.poll_cuda()
            else:
                tally.read()  # host memory (or a device without async copies): read at reports only
        return self._host + sum(t.nan for t in self._tallies.values())

    def exact(self) -> int:
        """The exact count; waits for the devices (for close(), when the training is over)."""
        for tally in self._tallies.values():
            tally.read()
        return self._host + sum(t.nan for t in self._tallies.values())


def peak_memory() -> tuple[int | None, str]:
    """The process's peak memory in bytes and where: CUDA memory allocated by torch on the current device when
    CUDA is in use, else the peak resident set size of the process (no device sync either way)."""
    torch = _torch()
    if torch is not None and torch.cuda.is_initialized():
        return int(torch.cuda.max_memory_allocated()), "gpu"
    try:
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    except (OSError, ValueError):  # pragma: no cover - platform without getrusage
        return None, "host"
    return (rss if sys.platform == "darwin" else rss * 1024), "host"  # Linux reports KiB, macOS bytes


class StepTelemetry:
    """Counts this attempt's steps and NaN/inf losses and reports them, batched, to the agent.

    ``control``: the library's ``ControlClient`` (anything with ``send(dict)``), or None outside the runner.
    ``rank``: the global rank under torch.distributed (None single-process); only rank 0 (or a single
    process) sends the run manifest, every rank sends its own ``telemetry`` (the agent takes the steps from
    rank 0 and the peak memory over its ranks).

    Call ``on_step(step, loss=None)`` once per training step, ``send_manifest_when_ready()`` at the first restore,
    ``report_soon()`` when a checkpoint has committed (from any thread), ``report()`` before an emergency
    stop (so the last step's time is known before the attempt ends), and ``close()`` at the end.
    """

    def __init__(self, control=None, *, rank: int | None = None, attempt: int | None = None,
                 report_every_s: float = REPORT_EVERY_S, clock=time.monotonic, wall=time.time) -> None:
        self.control = control
        self.rank = rank
        self.attempt = attempt
        self.report_every_s = report_every_s
        self.nan = NonFiniteCounter()
        self.steps = 0  # distinct steps this process trained
        self.steps_per_second: float | None = None
        self.restore_seconds: float | None = None  # how long restore() took (set by the Checkpointer)
        self._clock = clock
        self._wall = wall  # unix seconds: the controller compares the steps of attempts on different processes
        self._first: tuple[int, float] | None = None  # (step, unix time) of this process's first step
        self._latest: tuple[int, float] | None = None  # (step, unix time) of its newest step
        self._last_step: int | None = None
        self._window: tuple[float, int] | None = None  # (time, steps) where the current rate window began
        self._next_report = 0.0
        self._report_soon = False
        self._manifest_sent = False
        self._manifest_ahead: Future | None = None  # prepare_manifest()
        self._manifest_delivered = threading.Event()  # the manifest went (or could not be worked out)
        self._closed = False

    @property
    def nan_steps(self) -> int | None:
        """NaN/inf steps known now without waiting; None when no loss was reported."""
        return self.nan.poll() if self.nan.seen else None

    def on_step(self, step: int, loss=None) -> None:
        """Record one training step (and its loss, a float or a tensor); reports when one is due. No device sync."""
        if loss is not None:
            self.nan.add(loss)
        if step == self._last_step:
            return
        self._last_step = step
        self.steps += 1
        self._latest = (step, self._wall())
        if self._first is None:
            self._first = self._latest
        now = self._clock()
        if self._window is None:
            self._window = (now, self.steps)
            self._next_report = now + self.report_every_s
        elif self._report_soon or now >= self._next_report:
            self.report(now=now)

    def report_soon(self) -> None:
        """Ask for a report at the next step (a checkpoint committed); safe from any thread."""
        self._report_soon = True

    def report(self, final: bool = False, now: float | None = None) -> dict:
        """Send a ``telemetry`` message now (the training thread only) and return it."""
        now = self._clock() if now is None else now
        if self._window is not None:
            started, steps_then = self._window
            if self.steps > steps_then and now > started:
                self.steps_per_second = (self.steps - steps_then) / (now - started)
                self._window = (now, self.steps)
        peak, memory = peak_memory()
        nan_steps = (self.nan.exact() if final else self.nan.poll()) if self.nan.seen else None
        first, latest = self._first or (None, None), self._latest or (None, None)
        message = Telemetry(
            attempt=self.attempt, steps=self.steps,
            steps_per_second=None if self.steps_per_second is None else round(self.steps_per_second, 4),
            nan_steps=nan_steps, peak_memory_bytes=peak, memory=memory, final=final, first_step=first[0],
            first_step_at=first[1], last_step=latest[0], last_step_at=latest[1],
            restore_seconds=self.restore_seconds).to_json()
        self._report_soon = False
        self._next_report = now + self.report_every_s
        self._send(message)
        return message

    def send_manifest(self) -> dict | None:
        """Send the run manifest once per process (rank 0 only), waiting for it; return it, or None when not sent."""
        if self._manifest_sent or self.rank not in (None, 0):
            return None
        self._manifest_sent = True
        if self.control is None:
            return None
        if self._manifest_ahead is not None:
            manifest = self._manifest_ahead.result()
        else:
            from .run_manifest import run_manifest

            manifest = run_manifest()
        self._send(Manifest(manifest).to_json())
        self._manifest_delivered.set()
        return manifest

    def send_manifest_when_ready(self) -> None:
        """Send the run manifest once per process (rank 0 only) as soon as it is worked out, without waiting for
        it here (``restore()``: the manifest is not part of the restore's pause, which the ledger times)."""
        if self._manifest_sent or self.rank not in (None, 0) or self.control is None:
            return
        self.prepare_manifest()
        self._manifest_sent = True
        self._manifest_ahead.add_done_callback(self._send_prepared)  # at once when already done

    def _send_prepared(self, future: Future) -> None:
        try:
            self._send(Manifest(future.result()).to_json())
        except Exception as exc:  # noqa: BLE001 - a manifest that could not be worked out must not stop training
            log.warning("the run manifest could not be worked out", error=f"{type(exc).__name__}: {exc}")
        finally:
            self._manifest_delivered.set()

    def prepare_manifest(self) -> None:
        """Work out the run manifest in the background now (the Checkpointer does at construction), for
        ``send_manifest``: hashing the installed packages' list takes a second or more, which would otherwise
        come between the restore and the first training step."""
        if self._manifest_sent or self._manifest_ahead is not None or self.rank not in (None, 0) \
                or self.control is None:
            return
        from .run_manifest import run_manifest

        future: Future = Future()

        def work() -> None:
            try:
                future.set_result(run_manifest())
            except BaseException as exc:  # noqa: BLE001 - raised where send_manifest would have raised it
                future.set_exception(exc)

        self._manifest_ahead = future
        threading.Thread(target=work, name="run-manifest", daemon=True).start()

    def wait_manifest(self, timeout: float) -> None:
        """Wait, at most ``timeout`` seconds, for the manifest ``prepare_manifest`` is working out."""
        if self._manifest_ahead is not None:
            futures_wait([self._manifest_ahead], timeout)

    def wait_manifest_sent(self, timeout: float) -> bool:
        """Wait, at most ``timeout`` seconds, until a manifest asked to be sent when ready has gone (close())."""
        if not self._manifest_sent or self._manifest_ahead is None:
            return True
        return self._manifest_delivered.wait(timeout)

    def close(self) -> dict | None:
        """The final, exact report (waits for the device's NaN counter); idempotent. None when nothing trained."""
        if self._closed:
            return None
        self._closed = True
        if self.steps == 0 and not self.nan.seen and self.restore_seconds is None:
            return None
        try:
            return self.report(final=True)
        except Exception as exc:  # a failed device (a CUDA error ended the training) must not hide that error
            log.warning("final telemetry report failed", error=f"{type(exc).__name__}: {exc}")
            return None

    def _send(self, message: dict) -> None:
        if self.control is not None:
            self.control.send(message)
