"""Checkpointer: the training loop's one object for saving, restoring and stopping in time (docs/checkpointing.md).

Public methods check their arguments and state, then hand the work to the pieces beside this module: the
mode (``modes/``: one process, or every rank of a torch.distributed job together, an elastic gang's rank
included), ``staging`` (phase one, in the caller's thread), ``persist`` (phase two, in the background),
``restore``, ``schedule`` (when a periodic save is due, the one rule ``step()`` and ``poll()`` ask),
``signals`` and ``control`` (notices, which only set a flag). A framework's own checkpoint folder is handed
in through ``modes/folder.py``.
"""

from __future__ import annotations

import os
import threading
import time
from functools import partial
from pathlib import Path

from runner.protocol import environment as env
from runner.protocol import messages as msg

from . import cuda_gate, elastic, job_settings
from .agent_loss import AgentLoss
from .agent_loss import grace_from_env as agent_loss_grace
from .agreement import Decision
from .control import CheckpointRequest, ControlClient, describe_deadline
from .durable import DurableTier
from .folder_format import FolderFormat
from .hold import Hold
from .interval import IntervalPolicy, mtbf_from_env
from .local import LocalTier
from .log import get_logger
from .modes import choose
from .modes.folder import FrameworkFolders
from .persist import SaveJob
from .restore import Restored, load_flat, restore_into
from .resume_wait import ResumeWait
from .retention import Retention
from .schedule import SaveSchedule, check_step
from .signals import SignalNotices
from .telemetry import MANIFEST_AT_CLOSE_S, StepTelemetry
from .warm_pool import WarmPool

log = get_logger()
# A process started ahead prepares its restore (memory, run manifest) for at most this long before it says
# ``waiting`` (see _await_attempt).
PREPARE_AHEAD_SECONDS = 60.0

# An emergency stop leaves this much of the notice's deadline for the process to exit: 3 s, or a tenth of
# what is left when the notice is shorter, so a short deadline still leaves time for the durable upload.
STOP_MARGIN_S = 3.0
STOP_MARGIN_FRACTION = 0.1


def _always(step: int) -> bool:
    return True


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    try:
        return int(raw) if raw else None
    except ValueError:
        return None


class Checkpointer:
    """Saves registered objects, RNG states and ``extra`` values; restores the newest good checkpoint.

    ``Checkpointer(model=model, optimizer=opt, ..., extra={"tokens": 0})``; options default to the
    runner's variables (``RUNNER_CHECKPOINT_DIR``, ``RUNNER_CHECKPOINT_URL``, and the job file's
    ``RUNNER_CHECKPOINT_INTERVAL``/``RUNNER_CHECKPOINT_KEEP``) and then to ``./checkpoints`` with no
    durable tier, ``interval="auto"`` and ``keep=3``.

    When torch.distributed is initialised the Checkpointer is collective (docs/multinode.md): every rank builds it
    with its own objects and calls ``restore``, ``step``, ``save`` and ``close`` at the same steps; the
    checkpoint is one torch.distributed.checkpoint folder for the whole job, and a notice reaching any rank
    stops every rank at the same step (agreement.py).
    """

    def __init__(self, *, local_dir=None, durable_url: str | None = None, interval=None,
                 every_steps: int | None = None, keep: int | None = None, extra: dict | None = None,
                 **objects) -> None:
        interval, keep = job_settings.interval(interval), job_settings.keep(keep)
        fixed_s = job_settings.check_options(objects, extra, keep, every_steps, interval)

        self.objects = dict(objects)
        self.extra = extra if extra is not None else {}
        self.keep = keep
        self.every_steps = every_steps
        self.job_id = os.environ.get(env.JOB_ID) or None
        self.attempt = _env_int(env.ATTEMPT)
        self.local = LocalTier(local_dir or os.environ.get(env.CHECKPOINT_DIR) or "checkpoints")
        url = durable_url if durable_url is not None else os.environ.get(env.CHECKPOINT_URL)
        self.durable = DurableTier(url) if url else None
        self.stop_margin_s = STOP_MARGIN_S
        # Under the runner, the controller names the newest checkpoint it knows was committed by an
        # earlier attempt; anything newer was written by an attempt that has since been superseded.
        self._resume_wait = ResumeWait()  # started ahead of its attempt: the step comes later (resume_wait.py)
        self._handed_over = _env_int(env.RESUME_STEP)
        self._retention = Retention(self.attempt, self._handed_over)
        self._refused_after_stop = False

        self._policy = IntervalPolicy(fixed_s, mtbf_from_env())
        self._schedule = SaveSchedule(every_steps, self._policy, self._saved_at)
        self._mode = choose(self.local.root)  # one process, or every rank together (modes/)
        if self._mode.gang:
            self._mode.elastic = elastic.Elastic(self, self._mode)
        self._mode.bind(self._take_request, self._schedule, lambda: self._should_stop)
        self._decide = self._mode.decide  # once: step() runs every training step
        # A step with nothing pending asks the schedule alone, where no round is to be started (quiet_steps).
        self._due = self._schedule.due if self._mode.quiet_steps else _always
        self._seq = 0
        self._mode.check_same_setup({
            "objects": sorted((name, type(obj).__name__) for name, obj in self.objects.items()),
            "extra": sorted(self.extra), "every_steps": every_steps, "keep": keep, "durable": bool(self.durable)})
        self._persister = self._mode.make_persister(self.local, self.durable, keep, self._on_local,
                                                    self._on_durable, on_failed=self._on_failed,
                                                    retention=self._retention)
        if not self._resume_wait.pending:  # else once the attempt exists: the node on notice still commits
            self._mark_attempt()
        self._folder_format = FolderFormat(self._mode.writer)
        self._folders = FrameworkFolders(self)
        self._jobs: list[SaveJob] = []
        self._last_job: SaveJob | None = None
        self._stop_deadline: float | None = None  # monotonic
        self._should_stop = False
        self._stop_reason: str | None = None
        self._closed = False
        # Requests from the signal handler are set without a lock (a handler must never wait on one).
        self._signal_request: CheckpointRequest | None = None
        self._control_request: CheckpointRequest | None = None
        self._control_lock = threading.Lock()
        self._last_step: int | None = None  # the last step() call's, and whether it is under way, for
        self._in_step = False               # ``request_seen`` (a rank that never reaches the stop step)
        self._signals = SignalNotices(self._on_signal)
        self._signals.install()
        control_path = os.environ.get(env.CONTROL)
        who = self._mode.hello
        self._agent_loss = AgentLoss(agent_loss_grace(), self._queue_request)  # agent_loss.py

        def on_lost() -> None:
            self._resume_wait.on_lost()
            self._agent_loss.on_lost()
        self._hold = Hold()  # a notice's last seconds with the replacement not ready (hold.py)
        self._control = ControlClient(control_path, self._on_control, self.job_id, self.attempt, hello=who,
                                      on_lost=on_lost, on_resume=self._resume_wait.on_resume,
                                      on_recorded=self._retention.recorded,
                                      on_release=lambda: self._hold.wake(release=True),
                                      on_world=self._mode.on_world) if control_path else None
        self.telemetry = StepTelemetry(self._control, rank=None if self._mode.ranks is None else self._mode.rank,
                                       attempt=self.attempt)
        # The run manifest, sent after the first restore(), is worked out now beside the model's building and the
        # restore, not in the restore's pause (telemetry.py).
        self.telemetry.prepare_manifest()

    # ------------------------------------------------------------------ public API

    @property
    def should_stop(self) -> bool:
        """True once an emergency checkpoint has committed (or its deadline came): exit and be resumed."""
        return self._should_stop

    @property
    def stop_reason(self) -> str | None:
        """Why ``should_stop`` turned true, None before: ``notice`` (a preemption notice), ``drill`` (the resume
        drill), ``cancel`` (``runner cancel``), ``move`` (the cost policy moves the job to spot), ``SIGTERM`` or
        ``SIGUSR1`` (a signal to the training process), as the request that stopped it said."""
        return self._stop_reason

    @property
    def world_changed(self) -> bool:
        """True at the one ``step()`` of every rank at which an elastic gang moved to a new process group: build
        DistributedDataParallel again (on the new default group) and a new DataLoader iterator."""
        return self._mode.world_changed

    @property
    def world_size(self) -> int:
        """The number of ranks training now (1 outside torch.distributed)."""
        return self._mode.world_size

    @property
    def rank(self) -> int:
        """This process's rank in the current world (0 outside torch.distributed)."""
        return self._mode.rank

    def restore(self) -> int:
        """Load the newest checkpoint that verifies into every registered object; return its step (0 if none)."""
        self._check_open("restore")
        pool = self._await_attempt(warm=True)
        started = time.monotonic()
        step = self._mode.join_gang()  # an elastic gang's joiner: from a surviving peer, not from storage
        if step is not None:
            self.telemetry.restore_seconds = round(time.monotonic() - started, 4)
            self._schedule.restart()
            self._send({"op": "restored", "step": step, "manifest": None, "from_peer": True})
            return step
        self._mode.drain()
        handed_over = self._handed_over
        restored = restore_into(self.local, self.durable, self._mode.comm, self._mode.folder_leader, self.objects,
                                self.extra, partial(load_flat, self.objects, self.extra), max_step=handed_over,
                                pool=pool)
        del pool  # what the restore did not take is freed now
        self.telemetry.restore_seconds = round(time.monotonic() - started, 4)
        self.telemetry.send_manifest_when_ready()  # once per process: what this attempt runs with
        self._retention.restored(restored.step if restored is not None else None)
        self._report_restored(restored, handed_over)
        return restored.step if restored is not None else 0

    def _report_restored(self, restored: Restored | None, handed_over: int | None) -> None:
        """Log the restore and tell the agent (``restored``), naming a shortfall from the handed-over step."""
        step = restored.step if restored is not None else 0
        if handed_over and step < handed_over:
            # The controller recorded a commit of this step; resuming from less must not pass unnoticed.
            log.error("the checkpoint the controller handed over is missing or does not verify; resuming from an "
                      "older one" if step else "the checkpoint the controller handed over is missing or does not "
                      "verify, and no older one does either: starting from step 0",
                      handed_over=handed_over, resumed=step)
        self._schedule.restart()
        if restored is None:
            log.info("no checkpoint to restore; starting fresh", local=str(self.local.root),
                     durable=self.durable.shown if self.durable else None)
            self._send(msg.Restored(0, None, expected=handed_over or None).to_json())
            return
        log.info("restored checkpoint", step=step, manifest=restored.location,
                 **({} if restored.world_size == self._world_size else
                    {"saved_by_ranks": restored.world_size, "ranks_now": self._world_size}))
        self._send(msg.Restored(step, restored.location, expected=handed_over or None).to_json())

    def step(self, step: int, loss=None) -> None:
        """Call once per training step: saves when one is due or a notice is pending; otherwise returns at once.

        ``loss`` (optional, a float or a tensor on any device) counts toward the job's NaN steps without a
        device sync (telemetry.py)."""
        if self._resume_wait.pending:
            self._await_attempt()
        self.telemetry.on_step(step, loss)
        self._last_step = step
        if self._signal_request is None and self._control_request is None and not self._due(step):
            return  # nothing pending, no save due, one process (a rank goes on: every step starts a round)
        if self._should_stop or self._closed:
            return
        self._in_step = True
        try:
            decision = self._decide(step)
            if decision is not None:
                self._check_step(step)
                self._act(step, decision)
        finally:
            self._in_step = False

    def save(self, step: int) -> None:
        """Take a checkpoint now; returns once the state is staged (the training may go on).

        Once ``should_stop`` is true this attempt's emergency checkpoint has been handed to the job's next
        attempt, so a later ``save`` is refused (a warning, once): this process is being replaced."""
        self._check_open("save")
        self._check_step(step)
        self._await_attempt()
        if self._should_stop:
            if not self._refused_after_stop:
                self._refused_after_stop = True
                log.warning("save() after should_stop is ignored: the emergency checkpoint was handed over and "
                            "this process is being replaced; exit the training loop when should_stop is true",
                            step=step, emergency_step=self._last_job.step if self._last_job else None)
            return
        self._save(step, emergency=False)

    def _await_attempt(self, warm: bool = False) -> WarmPool | None:
        """A process started ahead of its attempt waits here for the step it resumes from (resume_wait.py).

        First the run manifest is worked out, and with ``warm`` (from ``restore()``, one process) the memory
        for the restore made ready (warm_pool.py: returned for the restore, None without a wait); only then
        does it say ``waiting``, which is when its agent calls the node ready (the node on notice trains on
        meanwhile), so that neither falls between the handover and the first step. Bounded: a slow one is
        finished while it waits."""
        if not self._resume_wait.pending:
            return None
        if self._control is None or not self._control.connected:  # nobody to say the word: an attempt as any
            self._resume_wait.pending = False
            self._mark_attempt()
            return None
        log.info("started ahead of this attempt: waiting for the handover")
        pool = WarmPool().start(self.local) if warm and self._mode.ranks is None else None
        self.telemetry.prepare_manifest()  # under way since the construction: finished before ``waiting``
        prepared_by = time.monotonic() + PREPARE_AHEAD_SECONDS
        if pool is not None:
            pool.join(PREPARE_AHEAD_SECONDS)
        if not cuda_gate.holds():  # (else the manifest, which names the GPUs, is finished after the word)
            self.telemetry.wait_manifest(max(0.0, prepared_by - time.monotonic()))
        try:
            self._handed_over = self._resume_wait.wait(self._send)
        finally:
            if pool is not None:
                pool.stop()
        self._retention.handed_over = self._handed_over
        log.info("the attempt has started", resume_step=self._handed_over)
        self._mark_attempt()
        return pool

    def _mark_attempt(self) -> None:
        """Leave this attempt's marker on the durable tier (one process of the job does): from now on an older
        attempt still running commits nothing there (durable.py)."""
        if self.attempt is None or self.durable is None or self._mode.rank != 0:
            return
        try:
            self.durable.mark_attempt(self.attempt, self.job_id)
        except Exception as exc:  # noqa: BLE001 - the store may be down now; uploads will say so too
            log.warning("could not mark this attempt on the durable tier; an older attempt still running is not "
                        "fenced off", attempt=self.attempt, url=self.durable.shown, error=self.durable.describe(exc))

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

    def close(self, timeout: float | None = None, _error: bool = False) -> None:
        """Wait for saves and uploads in flight, then release everything.

        The wait is bounded: ``timeout`` seconds (default: as long as one upload may take, at least
        ``UPLOAD_TIMEOUT_FLOOR_S``), and never past an emergency's deadline. A checkpoint still not on the durable
        tier then is named in a warning; its local copy is kept, and the threads left on a hung store end with
        the process."""
        if self._closed:
            return
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0):
            raise ValueError(f"Checkpointer.close(timeout={timeout!r}): use a number of seconds from 0, or None")
        self._mode.close()
        end = time.monotonic() + (self._persister.upload_timeout_s if timeout is None else float(timeout))
        if self._stop_deadline is not None:
            end = min(end, self._stop_deadline)
        left = lambda: max(0.0, end - time.monotonic())  # noqa: E731
        if not self.wait(left()):
            self._report_abandoned(timeout)
        self._closed = True
        # Our threads are given what is left, and at most 10 s (an upload to a stalled store may hang).
        self._persister.stop(min(10.0, left()))
        self._signals.uninstall()
        self.telemetry.wait_manifest_sent(min(MANIFEST_AT_CLOSE_S, left()))  # the agent hears it before ``closed``
        self.telemetry.close()
        self._send(msg.Closed(self._last_job.step if self._last_job else None, _error).to_json())
        if self._control is not None:
            self._control.close()
        self._mode.release_groups(self._persister.threads_ended())

    def _report_abandoned(self, timeout: float | None) -> None:
        """Name each checkpoint ``close()`` stopped waiting for: its step, its files, where the local copy is."""
        for job in self._jobs:
            if job.durable_done.is_set():
                continue
            folder = self.local.folder(job.step)
            log.warning("close() gave up waiting: this checkpoint did not reach the durable tier; its local copy "
                        "is kept", step=job.step, files=sorted(job.own_files) or None,
                        local=str(folder) if job.local_manifest is not None else None,
                        url=self.durable.location(job.step) if self.durable is not None else None,
                        waited_s=None if timeout is None else round(float(timeout), 1),
                        local_committed=job.local_manifest is not None)

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.close(_error=exc_type is not None)

    # ------------------------------------------------------------------ framework integrations
    # A framework (runner/integrations) writes its own checkpoint folder (modes/folder.py): ``poll`` says at
    # which step to have it written, ``incoming``/``commit_folder`` commit that folder like any save,
    # ``restore_folder`` finds the newest one that verifies. The requests, the agreement between ranks, the
    # emergency wait for the durable tier and every message to the agent are the plain Checkpointer's.

    def poll(self, step: int) -> Decision | None:
        """What to do at this step, without saving: None, or a Decision (``request.stop``: the emergency)."""
        self._check_step(step)
        if self._should_stop or self._closed:
            return None
        return self._mode.decide(step, in_step=False)  # one decision for every rank, as in step()

    def incoming(self, step: int) -> Path | None:
        """A new, empty folder for a framework's checkpoint files of ``step`` (on this local folder's leader;
        None on other ranks). Under torch.distributed it waits for every rank first (all wrote their files)."""
        return self._folders.incoming(step)

    def reclaim_signals(self) -> None:
        """Take SIGTERM/SIGUSR1 back from a framework that installed its own handlers over ours (Lightning)."""
        self._signals.reclaim()

    def commit_folder(self, step: int, folder: Path | None, decision: Decision, payload: dict) -> None:
        """Commit the files put into ``incoming(step)`` as the checkpoint of ``step``; on an emergency, wait
        for the durable tier (up to the deadline), tell the agent and set ``should_stop``."""
        self._check_open("commit_folder")
        self._folders.commit(step, folder, decision, payload)

    def restore_folder(self, check) -> Restored | None:
        """The newest committed folder checkpoint that verifies and that ``check(folder, manifest, where)``
        accepts (it raises RestoreError otherwise), materialised in the local tier; None when there is none.
        Nothing is reported: the integration calls ``report_restored`` once the framework has loaded it."""
        self._check_open("restore_folder")
        self._await_attempt()
        return self._folders.restore(check)

    def report_restored(self, restored: Restored | None) -> None:
        """Tell the agent where the training resumed from (``restored``), as ``restore()`` does."""
        self._folders.report_restored(restored)

    # ------------------------------------------------------------------ hooks

    def _check_open(self, action: str) -> None:
        if self._closed:
            raise RuntimeError(f"Checkpointer.{action}() after close(); build a new Checkpointer")

    _check_step = staticmethod(check_step)

    @property
    def _world_size(self) -> int:
        return self._mode.world_size

    def _act(self, step: int, decision: Decision) -> None:
        """Carry out a step's decision: a save (periodic or requested), a hold, or the emergency stop."""
        request = decision.request
        if request is not None:
            log.info("checkpoint requested", step=step, reason=request.reason, stop=request.stop,
                     origin=decision.origin, deadline=describe_deadline(request.deadline))
            if request.hold:
                self._checkpoint_and_hold(step, request)
                return
            if request.stop:
                self._emergency(step, request, origin=decision.origin)
                return
        if self._saved_at(step):
            return
        if request is None and self._persister.buffer_held_by_upload():
            # A periodic save would block the training until a timing checkpoint's upload from the staged
            # buffer ends (seconds for a large state): the next due step takes it.
            log.debug("periodic checkpoint deferred: the staged buffer is still being uploaded", step=step)
            return
        # A timing checkpoint is saved as the emergency one would be (from the staged buffer), so its time to
        # durable predicts the emergency's (agents/train_through.py).
        self._save(step, emergency=False, from_buffer=request is not None and request.timing)

    def _saved_at(self, step: int) -> bool:
        return self._last_job is not None and self._last_job.step == step and self._last_job.error is None

    def _take_request(self) -> CheckpointRequest | None:
        request, self._signal_request = self._signal_request, None
        with self._control_lock:
            control, self._control_request = self._control_request, None
        return request.merge(control) if request else control

    def _save(self, step: int, emergency: bool, folder: Path | None = None, payload: dict | None = None,
              from_buffer: bool = False) -> SaveJob:
        """Stage the registered objects' state, or (``payload`` given) hand in a framework's folder, and submit it
        (``from_buffer``: uploaded the way an emergency checkpoint is, as a timing checkpoint asks)."""
        started = time.monotonic()
        self._persister.buffer_free.wait()  # the previous save is still writing out of the reused buffer
        self._seq += 1
        state = None if payload is not None else self._mode.capture(step, self.objects, self.extra)
        staged = folder if payload is not None else self._mode.stager.stage(state)
        job = SaveJob(step, staged, emergency, self.attempt, self.job_id, seq=self._seq, started=started,
                      format=self._folder_format if payload is not None else None, payload=payload,
                      upload_from_buffer=from_buffer, replicated=state is not None and self._mode.replicated(state))
        self._persister.submit(job)
        self._schedule.saved(cost_s=time.monotonic() - started)
        self._jobs = [j for j in self._jobs if not j.finished] + [job]
        self._last_job = job
        return job

    def _checkpoint_and_hold(self, step: int, request: CheckpointRequest) -> None:
        """An emergency checkpoint of this step, durable, then the training loop waits here (hold.py)."""
        job = self._last_job
        if self._mode.needs_emergency_save(job, step):
            job = self._save(step, emergency=True)
        self._retention.emergency(step)
        left = None if request.deadline is None else max(0.0, request.deadline - time.time())
        durable = job.durable_done.wait(left) and (job.durable_manifest is not None if self.durable is not None
                                                   else job.error is None)
        try:
            self.telemetry.report()  # the held step's time reaches the agent before the attempt may end
        except Exception as exc:  # noqa: BLE001 - a failed device must not keep the hold from starting
            log.warning("telemetry report before holding failed", error=f"{type(exc).__name__}: {exc}")
        self._send(msg.Holding(step, bool(durable and self.durable is not None)).to_json())
        log.info("holding at an emergency checkpoint until the replacement is ready or the notice proves false",
                 step=step, durable=durable, deadline=describe_deadline(request.deadline))
        self._hold.wait(request.deadline, stop_pending=self._stop_pending)
        released = self._hold.released
        self._hold.reset()
        request = None if released else self._take_request()
        if request is None:
            log.info("hold released: training goes on", step=step)
            return
        # A stop: the held step is the emergency checkpoint, already durable.
        self._act(step, Decision(save=True, request=request, origin="self"))

    def _emergency(self, step: int, request: CheckpointRequest, origin: str = "self",
                   job: SaveJob | None = None) -> None:
        deadline = None
        if request.deadline is not None:
            left = request.deadline - time.time()
            margin = min(self.stop_margin_s, max(0.0, STOP_MARGIN_FRACTION * left))
            deadline = time.monotonic() + left - margin
        if job is None:  # else a framework's folder, handed in by the caller
            job = self._last_job
            if self._mode.needs_emergency_save(job, step):
                job = self._save(step, emergency=True)
        self._retention.emergency(step)  # what this attempt's handover names: retention keeps it
        remaining = lambda: None if deadline is None else max(0.0, deadline - time.monotonic())  # noqa: E731
        estimate = self._policy.commit_s
        if self.durable is not None and _durable(job):
            # A hold's step (hold.py): committed on the durable tier before the stop came; nothing to wait for.
            log.info("this step is already durable: nothing more to save", step=step, url=job.durable_manifest)
        elif self.durable is not None and estimate and deadline is not None and estimate > remaining():
            log.warning("the durable tier will likely miss the deadline; the local checkpoint is kept",
                        step=step, estimate_s=round(estimate, 2), left_s=round(remaining(), 2),
                        path=str(self.local.folder(step)))
        done = job.durable_done.wait(remaining())
        durable = done and (job.durable_manifest is not None if self.durable is not None else job.error is None)
        if not done and self.durable is not None:
            log.warning("emergency checkpoint did not reach the durable tier before the deadline; stopping with "
                        "the local copy only", step=step, path=str(self.local.folder(step)), url=self.durable.shown)
        self._stop_deadline = deadline
        self._stop_reason = request.reason
        self._should_stop = True
        # The last step's time reaches the agent before ``stopping``: the attempt may end at the handover,
        # before close() sends the final report.
        try:
            self.telemetry.report()
        except Exception as exc:  # a failed device must not keep the emergency from saying it is done
            log.warning("telemetry report before stopping failed", error=f"{type(exc).__name__}: {exc}")
        self._send(msg.Stopping(step, bool(durable and self.durable is not None), request.reason, origin).to_json())

    def _on_signal(self, request: CheckpointRequest) -> None:
        self._signal_request = request.merge(self._signal_request)
        if request.stop:
            self._resume_wait.on_stop_signal(request.reason)  # started ahead and waiting: it just ends

    def _stop_pending(self) -> bool:
        """A stop asked for and not yet served (a signal, the agent's loss): ends a hold."""
        pending = [r for r in (self._signal_request, self._control_request) if r is not None]
        return any(r.stop for r in pending)

    def _queue_request(self, request: CheckpointRequest) -> None:
        with self._control_lock:
            self._control_request = request.merge(self._control_request)

    def _on_control(self, request: CheckpointRequest) -> None:
        self._queue_request(request)
        if request.stop:  # on the reader thread: answered even while the training thread hangs
            self._send(msg.RequestSeen(request.reason, self._last_step, self._in_step).to_json())

    def _first_rank(self) -> bool:
        """The job's only or first rank: its commits are the job's. The first process of each other node (a
        folder's leader) tells its own agent only how long they took (``timing_only``)."""
        return self._mode.ranks is None or self._mode.rank == 0

    def _on_local(self, job: SaveJob) -> None:
        seconds = time.monotonic() - job.started
        first = self._first_rank()
        if first:
            self.telemetry.report_soon()
            if self.durable is None:
                self._policy.record(commit_s=seconds)
        self._send(msg.Committed(job.step, str(job.local_manifest), False, job.emergency, round(seconds, 4),
                             job.manifest.bytes, timing_only=not first, replicated=job.replicated).to_json())

    def _on_failed(self, job: SaveJob, tier: str, error: BaseException) -> None:
        text = self.durable.describe(error) if self.durable is not None else f"{type(error).__name__}: {error}"
        self._send(msg.Failed(job.step, tier, text).to_json())

    def _on_durable(self, job: SaveJob) -> None:
        seconds = time.monotonic() - job.started
        first = self._first_rank()
        if first:
            self._policy.record(commit_s=seconds)
        self._send(msg.Committed(job.step, job.durable_manifest, True, job.emergency, round(seconds, 4),
                             job.manifest.bytes, staged_seconds=job.staged_seconds, from_buffer=job.from_buffer,
                             timing_only=not first).to_json())

    def _send(self, message: dict) -> None:
        if self._control is not None:
            self._control.send(message)


def _durable(job: SaveJob | None) -> bool:
    """Is this save already committed on the durable tier?"""
    return job is not None and job.durable_done.is_set() and job.durable_manifest is not None
