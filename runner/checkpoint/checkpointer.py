"""Checkpointer: the training loop's one object for saving, restoring and stopping in time (CONTRACT §3).

Public methods check their arguments and state, then hand the work to the pieces beside this module:
``staging`` (phase one, in the caller's thread), ``persist`` (phase two, in the background), ``restore``,
``interval`` (when a periodic save is due), ``signals`` and ``control`` (notices, which only set a flag).
"""

from __future__ import annotations

import os
import threading
import time

from . import rng
from .control import CheckpointRequest, ControlClient
from .durable import DurableTier
from .errors import CheckpointConfigError, RestoreError
from .interval import IntervalPolicy, mtbf_from_env, parse_duration
from .local import LocalTier
from .log import get_logger
from .persist import Persister, SaveJob
from .restore import load_newest
from .signals import SignalNotices
from .staging import Stager

log = get_logger()

# An emergency stop leaves this much of the notice's deadline for the process to exit: 3 s, or a tenth of
# what is left when the notice is shorter, so a short deadline still leaves time for the durable upload.
STOP_MARGIN_S = 3.0
STOP_MARGIN_FRACTION = 0.1
_OPTIONS = ("local_dir", "durable_url", "interval", "every_steps", "keep", "extra")


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    try:
        return int(raw) if raw else None
    except ValueError:
        return None


class Checkpointer:
    """Saves registered objects, RNG states and ``extra`` values; restores the newest good checkpoint.

    ``Checkpointer(model=model, optimizer=opt, ..., extra={"tokens": 0})``; options default to the
    runner's variables (``RUNNER_CHECKPOINT_DIR``, ``RUNNER_CHECKPOINT_URL``) and then to
    ``./checkpoints`` with no durable tier.
    """

    def __init__(self, *, local_dir=None, durable_url: str | None = None, interval="auto",
                 every_steps: int | None = None, keep: int = 3, extra: dict | None = None, **objects) -> None:
        for name, obj in objects.items():
            if not (callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))):
                raise TypeError(f"Checkpointer({name}=...): {type(obj).__name__} has no state_dict()/"
                                f"load_state_dict(); put plain values in extra={{{name!r}: ...}}")
        if extra is not None and not isinstance(extra, dict):
            raise TypeError("Checkpointer(extra=...) takes a dict of plain values, such as extra={'tokens': 0}")
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise CheckpointConfigError(f"Checkpointer(keep={keep!r}): keep must be an integer of at least 1")
        if every_steps is not None and (isinstance(every_steps, bool) or not isinstance(every_steps, int)
                                        or every_steps < 1):
            raise CheckpointConfigError(f"Checkpointer(every_steps={every_steps!r}): use a positive integer or None")
        if isinstance(interval, str) and interval.strip().lower() == "auto":
            fixed_s = None
        else:
            try:
                fixed_s = parse_duration(interval)
            except ValueError as exc:
                raise CheckpointConfigError(f"Checkpointer(interval=...): {exc}; or use 'auto'") from exc

        self.objects = dict(objects)
        self.extra = extra if extra is not None else {}
        self.keep = keep
        self.every_steps = every_steps
        self.job_id = os.environ.get("RUNNER_JOB_ID") or None
        self.attempt = _env_int("RUNNER_ATTEMPT")
        self.local = LocalTier(local_dir or os.environ.get("RUNNER_CHECKPOINT_DIR") or "checkpoints")
        url = durable_url if durable_url is not None else os.environ.get("RUNNER_CHECKPOINT_URL")
        self.durable = DurableTier(url) if url else None
        self.stop_margin_s = STOP_MARGIN_S

        self._policy = IntervalPolicy(fixed_s, mtbf_from_env())
        self._next_due = time.monotonic() + self._policy.period()
        self._stager = Stager()
        self._persister = Persister(self.local, self.durable, keep, self._on_local, self._on_durable)
        self._jobs: list[SaveJob] = []
        self._last_job: SaveJob | None = None
        self._stop_deadline: float | None = None  # monotonic
        self._should_stop = False
        self._closed = False
        # Requests from the signal handler are set without a lock (a handler must never wait on one).
        self._signal_request: CheckpointRequest | None = None
        self._control_request: CheckpointRequest | None = None
        self._control_lock = threading.Lock()
        self._signals = SignalNotices(self._on_signal)
        self._signals.install()
        control_path = os.environ.get("RUNNER_CONTROL")
        self._control = ControlClient(control_path, self._on_control, self.job_id, self.attempt) \
            if control_path else None

    # ------------------------------------------------------------------ public API

    @property
    def should_stop(self) -> bool:
        """True once an emergency checkpoint has committed (or its deadline came): exit and be resumed."""
        return self._should_stop

    def restore(self) -> int:
        """Load the newest checkpoint that verifies into every registered object; return its step (0 if none)."""
        self._check_open("restore")
        # Under the runner, the controller names the newest checkpoint it knows was committed by an
        # earlier attempt; anything newer was written by an attempt that has since been superseded.
        loaded = load_newest(self.local, self.durable, max_step=_env_int("RUNNER_RESUME_STEP"))
        if loaded is None:
            log.info("no checkpoint to restore; starting fresh", local=str(self.local.root),
                     durable=self.durable.url if self.durable else None)
            self._send({"op": "restored", "step": 0, "manifest": None})
            return 0
        self._apply(loaded.state, loaded.location)
        log.info("restored checkpoint", step=loaded.step, manifest=loaded.location)
        self._next_due = time.monotonic() + self._policy.period()
        self._send({"op": "restored", "step": loaded.step, "manifest": loaded.location})
        return loaded.step

    def step(self, step: int) -> None:
        """Call once per training step: saves when one is due or a notice is pending; otherwise returns at once."""
        if self._signal_request is None and self._control_request is None:
            if self._should_stop or self._closed:
                return
            if self.every_steps is not None:
                if step % self.every_steps or (self._last_job is not None and self._last_job.step == step):
                    return
            elif time.monotonic() < self._next_due:
                return
            self._check_step(step)
            self._save(step, emergency=False)
            return
        self._check_step(step)
        self._serve_request(step)

    def save(self, step: int) -> None:
        """Take a checkpoint now; returns once the state is staged (the training may go on)."""
        self._check_open("save")
        self._check_step(step)
        self._save(step, emergency=False)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every save in flight is committed on both tiers; False if one failed or time ran out."""
        end = None if timeout is None else time.monotonic() + timeout
        ok = True
        for job in list(self._jobs):
            remaining = None if end is None else max(0.0, end - time.monotonic())
            if not job.durable_done.wait(remaining) or job.error is not None:
                ok = False
        self._jobs = [j for j in self._jobs if not j.finished]
        return ok

    def close(self) -> None:
        """Wait for saves and uploads in flight (no later than an emergency's deadline), then release everything."""
        if self._closed:
            return
        timeout = None if self._stop_deadline is None else max(0.0, self._stop_deadline - time.monotonic())
        self.wait(timeout)
        self._closed = True
        self._persister.stop()
        self._signals.uninstall()
        if self._control is not None:
            self._control.close()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ hooks

    def _check_open(self, action: str) -> None:
        if self._closed:
            raise RuntimeError(f"Checkpointer.{action}() after close(); build a new Checkpointer")

    @staticmethod
    def _check_step(step) -> None:
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"checkpoint step must be a non-negative int, got {step!r}")

    def _save(self, step: int, emergency: bool) -> SaveJob:
        started = time.monotonic()
        self._persister.buffer_free.wait()  # the previous save is still writing out of the reused buffer
        state = {
            "step": step,
            "objects": {name: obj.state_dict() for name, obj in self.objects.items()},
            "extra": dict(self.extra),
            "rng": rng.capture(),
        }
        job = SaveJob(step, self._stager.stage(state), emergency, self.attempt, self.job_id, started=started)
        self._persister.submit(job)
        self._policy.record(cost_s=time.monotonic() - started)
        self._next_due = time.monotonic() + self._policy.period()
        self._jobs = [j for j in self._jobs if not j.finished] + [job]
        self._last_job = job
        return job

    def _apply(self, state: dict, where: str) -> None:
        saved = state["objects"]
        missing = [name for name in self.objects if name not in saved]
        if missing:
            raise RestoreError(f"{where} has no state for {', '.join(missing)}; register the same objects as the "
                               f"run that saved it, or point local_dir/durable_url elsewhere to start fresh")
        for name, obj in self.objects.items():
            try:
                obj.load_state_dict(saved[name])
            except Exception as exc:
                raise RestoreError(f"{where}: {name}.load_state_dict failed ({exc}); the checkpoint was saved "
                                   f"by a different {name}. Use the same setup, or another checkpoint folder") from exc
        self.extra.update(state["extra"])
        rng.restore(state["rng"])

    def _serve_request(self, step: int) -> None:
        request, self._signal_request = self._signal_request, None
        with self._control_lock:
            request, self._control_request = (request.merge(self._control_request) if request
                                              else self._control_request), None
        if request is None or self._should_stop or self._closed:
            return
        log.info("checkpoint requested", step=step, reason=request.reason, stop=request.stop,
                 deadline=request.deadline)
        if not request.stop:
            if self._last_job is None or self._last_job.step != step:
                self._save(step, emergency=False)
            return
        self._emergency(step, request)

    def _emergency(self, step: int, request: CheckpointRequest) -> None:
        deadline = None
        if request.deadline is not None:
            left = request.deadline - time.time()
            margin = min(self.stop_margin_s, max(0.0, STOP_MARGIN_FRACTION * left))
            deadline = time.monotonic() + left - margin
        job = self._last_job
        if job is None or job.step != step or job.error is not None:
            job = self._save(step, emergency=True)
        remaining = lambda: None if deadline is None else max(0.0, deadline - time.monotonic())  # noqa: E731
        estimate = self._policy.commit_s
        if self.durable is not None and estimate and deadline is not None and estimate > remaining():
            log.warning("the durable tier will likely miss the deadline; the local checkpoint is kept",
                        step=step, estimate_s=round(estimate, 2), left_s=round(remaining(), 2),
                        path=str(self.local.folder(step)))
        done = job.durable_done.wait(remaining())
        durable = done and job.error is None and (self.durable is None or job.durable_manifest is not None)
        if not done and self.durable is not None:
            log.warning("emergency checkpoint did not reach the durable tier before the deadline; stopping with "
                        "the local copy only", step=step, path=str(self.local.folder(step)), url=self.durable.url)
        self._stop_deadline = deadline
        self._should_stop = True
        self._send({"op": "stopping", "step": step, "durable": bool(durable and self.durable is not None)})

    def _on_signal(self, request: CheckpointRequest) -> None:
        self._signal_request = request.merge(self._signal_request)

    def _on_control(self, request: CheckpointRequest) -> None:
        with self._control_lock:
            self._control_request = request.merge(self._control_request)

    def _on_local(self, job: SaveJob) -> None:
        seconds = time.monotonic() - job.started
        if self.durable is None:
            self._policy.record(commit_s=seconds)
        self._send({"op": "committed", "step": job.step, "manifest": str(job.local_manifest), "durable": False,
                    "emergency": job.emergency, "seconds": round(seconds, 4), "bytes": job.manifest.bytes})

    def _on_durable(self, job: SaveJob) -> None:
        seconds = time.monotonic() - job.started
        self._policy.record(commit_s=seconds)
        self._send({"op": "committed", "step": job.step, "manifest": job.durable_manifest, "durable": True,
                    "emergency": job.emergency, "seconds": round(seconds, 4), "bytes": job.manifest.bytes})

    def _send(self, message: dict) -> None:
        if self._control is not None:
            self._control.send(message)
