"""The agent's life on one node: register, fetch the workdir, run setup and run, report the end.

This is supervise mode, for a VM the controller launched. Sidecar mode, for a training process started
beside the agent (a pod's training container), is agents/sidecar.py; both build on agents/core.py.
"""

from __future__ import annotations

import io
import os
import signal
import tarfile
import threading
import time
from pathlib import Path

import structlog

from runner import sdnotify, wire
from runner.errors import RunnerError
from runner.protocol import environment
from runner.protocol.actions import JOB_STOPPING_ACTIONS, Action, RegisterStatus
from runner.protocol.events import EndReason, EventKind
from runner.protocol.messages import Op

from .cancel import cancel_plan
from .config import AgentConfig
from .control import ControlServer
from .core import AgentCore
from .drill import ResumeDrill
from .elastic import ElasticWorld, LauncherWatch
from .emergency import ChildProcess, EmergencyStop
from .handover import Handover
from .launcher_exit import RanksFinished, watch_launcher, watch_ranks_finished
from .gang import GangRanks, node_address, register_for_attempt
from . import gang_prestart
from .gang_prestart import KeptNodeStartAhead
from .logship import LogShipper
from .prefetch import CheckpointPrefetch, local_checkpoint_root, prefetch_for, resume_step
from .prestart import DeferredOutput, LocalOutput, Prestarted, prestart_environment
from .failure_kind import OutputTail, classify, signal_death
from .stop_progress import StopProgress
from .stop_with_checkpoint import StopPlan, StopWithCheckpoint
from .supervisor import Supervisor
from .workdir_archive import extract_safely
from .watchers import Notice

log = structlog.get_logger(__name__)
SHUTDOWN_GRACE_SECONDS = 25.0  # SIGTERM at shutdown: GCP powers off ~30 s later
NOTICE_HEARTBEAT_SECONDS = 0.5  # while the controller's word on a notice trained through is awaited
PRESTART_READY_SECONDS = 300.0  # at most, for a process started ahead to reach restore() before ready is said
# While an elastic gang trains with fewer nodes than the job's: the grown world comes on a heartbeat's reply, and
# the replacement's ranks wait in it from the moment it is issued.
ELASTIC_HEARTBEAT_SECONDS = 0.5
PREFETCH_WAIT_SECONDS = 600.0  # at most, for a checkpoint still arriving (agents/prefetch.py stops at a stall)


class JobCannotStart(RunnerError):
    """The job's workdir or command cannot be brought to life on this node: the attempt fails, saying why."""


class Agent(KeptNodeStartAhead, AgentCore):
    def __init__(self, config: AgentConfig):
        super().__init__(config)
        self.client = self.reporter.client
        self.cancelled = threading.Event()
        self.shutdown = threading.Event()
        self.current: Supervisor | None = None
        self.phase = "starting"
        self.training_pid: int | None = None
        self.drill: ResumeDrill | None = None
        self.gang = GangRanks()  # what this node's ranks said about a gang's stop and restore
        self.stop_progress = StopProgress()  # how far each local rank got toward a stop asked for
        self.cancel_stop: StopWithCheckpoint | None = None  # a stop the controller asked for
        self.stop_reason = EndReason.CANCELLED  # the exit reason of a stop the controller asked for (or moved)
        self.output_tail: OutputTail | None = None
        self.failure_kind: str | None = None  # of a failed exit no relaunch can fix (agents/failure_kind.py)
        self.prefetch: CheckpointPrefetch | None = None  # the job's checkpoint, fetched while setup runs
        self.setup_output: LocalOutput | None = None  # a prepared replacement's setup output, until its attempt
        self.prestarted: Prestarted | None = None  # the job's process, started before its attempt exists
        self.adopted: Prestarted | None = None  # that process, now its attempt's
        self._ahead_lock = threading.Lock()
        self._ahead_for: int | None = None  # the next attempt a kept gang node was told to start ahead
        self._ahead_abandoned = threading.Event()  # the controller says that next attempt will not adopt it
        self.trainee_pids: set[int] = set()  # the training processes that said hello in this attempt
        for op in (Op.HELLO, Op.REQUEST_SEEN, Op.STOPPING, Op.CLOSED):
            self.on_op(op, self.stop_progress.on_message)
        self.on_op(Op.HELLO, self._on_hello)
        self.on_op(Op.WORLD_CHANGED, self._on_world_changed)
        self.assignment: dict = {}  # the controller's answer to the registration (run())
        self.elastic = ElasticWorld(self.send_control, self._report_world)  # an elastic gang's worlds
        self.launcher_watch: LauncherWatch | None = None
        self.ranks_finished: RanksFinished | None = None  # node 0's part reported while its launcher runs

    def run(self) -> int:
        sdnotify.start_watchdog()  # also keeps NOTIFY_SOCKET out of the job's environment
        self.address = node_address(self.config.address, self.config.controller_url)
        assignment = register_for_attempt(self.reporter.register, self.address, self.shutdown)
        if assignment is None:
            return 1
        prepared = assignment.get("status") == RegisterStatus.PREPARE  # a replacement launched during a notice
        self.assignment = assignment["assignment"] if prepared else assignment
        log.info("registered", job=self.assignment["job_id"], attempt=self.assignment["attempt"],
                 prepared_replacement=prepared)
        self.local_log = open(self.config.scratch_dir / "job.log", "ab")
        self.control = self._start_control_channel()
        gang = self.assignment.get("gang") or {}
        if gang.get("num_nodes", 1) == 1 and not gang.get("elastic"):  # a gang's nodes stop and restart together
            self.handover = Handover(lambda data: self.reporter.event(EventKind.HANDOVER, data))
        # Every node trains on through a notice that leaves time: a single node and a gang's node while the
        # controller prepares its replacement (the whole gang then stops at one step: agents/train_through.py);
        # an elastic gang's node while the others move to a world without it (agents/elastic.py).
        self.may_train_through = True
        self.gang_node = gang.get("num_nodes", 1) > 1 and not gang.get("elastic")
        self.emergency = EmergencyStop(send=self.send_control, trainee=self._child(),
                                       on_durable=self.handover.on_durable if self.handover else None)
        self.watch_loop = self.start_watchers()
        signal.signal(signal.SIGTERM, lambda *_: self._on_sigterm())
        self.reporter.heartbeats(self._heartbeat_interval, self._status, self._on_action, self.shutdown,
                                 on_world=self.elastic.on_world, on_prestart=self._on_prestart)
        sdnotify.ready()
        try:
            if prepared and not self._get_ready():
                return 1
            self._run_attempts(setup_done=prepared)
        finally:
            sdnotify.stopping()
            self.shutdown.set()
            self._discard_ahead()
            self.stop_background()
        return 0

    def _get_ready(self) -> bool:
        """A replacement prepared while the job still trains elsewhere: fetch the workdir and run setup now,
        report ready, and wait (registering again) until the node on notice hands over and this node's
        attempt exists. False when this node is not needed after all (or cannot get ready)."""
        self.phase = "setup"
        self.setup_output = LocalOutput(self.local_log)  # no attempt to ship to yet: kept until there is one
        self.shipper = self.setup_output
        # The newest durable checkpoint now, then the emergency one as the node on notice uploads it.
        self.prefetch = prefetch_for(self.assignment, local_checkpoint_root(self.assignment, self.config.scratch_dir))
        try:
            workdir = self._prepare_workdir()
            code = self._run_setup_reported(workdir, self._environment())
        except JobCannotStart as exc:
            self.reporter.report_exit(EndReason.FAILED, None, f"prepared replacement: {exc}")
            return False
        if self.cancelled.is_set():
            return False
        if code != 0:
            self.reporter.report_exit(EndReason.FAILED, code, "prepared replacement: setup failed with exit code "
                                      f"{code}: {self.shipper.tail()}")
            return False
        self.phase = "ready"
        if self.assignment.get("prestart"):
            self._prestart(workdir)
        gang_ahead = self.prestarted is not None and bool(self.assignment.get("gang"))  # a gang's next attempt
        # The controller now tells the gang's other nodes to start theirs (agents/gang_prestart.py); too late
        # (the gang has stopped), this one is stopped
        if gang_ahead and not gang_prestart.report(self.reporter, self.assignment["attempt"], gang_prestart.STARTED):
            log.info("the gang stopped before its next attempt could be started ahead; it starts at the handover")
            self._drop_ahead(self.prestarted)
            gang_ahead = False
        if self.prestarted is not None:
            # Ready to resume is once the process started ahead waits in restore() (a GPU gang's: before its first
            # CUDA use): the node on notice trains on through this one's interpreter start, imports and model
            # building instead of pausing for them.
            prestarted = self.prestarted
            waits = prestarted.wait_in_restore(
                PRESTART_READY_SECONDS,
                lambda: self.cancelled.is_set() or self.shutdown.is_set() or self._ahead_abandoned.is_set()
                or (gang_ahead and prestarted.cuda_in_use.is_set()))
            if gang_ahead:
                self._report_ahead(self.prestarted, waits)
        self.reporter.patiently(lambda: self.client.post("/v1/agent/events", {"kind": EventKind.READY, "data": {}}),
                                "ready report")
        log.info("ready: waiting for the handover")
        assignment = register_for_attempt(self.reporter.register, self.address, self.shutdown)
        if assignment is None or self.cancelled.is_set():
            log.info("the prepared replacement is not needed; stopping")
            self._end_prefetch()
            if self.prestarted is not None:
                self.prestarted.discard(self.config.stop_grace_seconds)
            return False
        self.assignment = assignment
        log.info("registered", job=assignment["job_id"], attempt=assignment["attempt"],
                 resume_step=(assignment["checkpoint"].get("resume") or {}).get("step"))
        if ((assignment.get("gang") or {}).get("num_nodes") or 1) > 1:  # a gang's rank: no handover of its own
            self.handover = self.emergency.on_durable = None
            self.gang_node = not assignment["gang"].get("elastic")
        self._end_prefetch(wait_for=resume_step(assignment))
        return True

    def _prestart(self, workdir: Path) -> None:
        """Start the job's process now; it waits in restore() until the handover (agents/prestart.py)."""
        output = DeferredOutput(self.local_log)
        tail = OutputTail(output)
        # A GPU gang's replacement holds before its first CUDA use, as its kept nodes do (agents/gang_prestart.py)
        env = prestart_environment(self._environment(), gang_prestart.holds_before_cuda(self.assignment))
        supervisor = Supervisor(self.assignment["run"], str(workdir), env, tail)
        try:
            supervisor.start()
        except (OSError, ValueError) as exc:
            log.warning("the job's process could not be started ahead; it starts at the handover", error=str(exc))
            return
        self.prestarted = Prestarted(supervisor, self.assignment["attempt"], output, tail,
                                     gang=self.assignment.get("gang"),
                                     counts_before=self.control.counts() if self.control is not None else (0, 0))

    def _adopt_prestarted(self) -> bool:
        """The process started ahead becomes this attempt's, or is stopped (then False: start one now)."""
        with self._ahead_lock:
            prestarted, self.prestarted = self.prestarted, None
        self.adopted = None
        if prestarted is None:
            return False
        # (a kept gang node's process started ahead listens on a channel of its own: its ``resume`` goes there)
        send = prestarted.control.send if prestarted.control is not None else self.send_control
        if not prestarted.adopt(self.assignment, self.shipper, send, resume_step(self.assignment)):
            log.info("the process started ahead is not this attempt's; starting the job anew",
                     attempt=self.assignment.get("attempt"))
            prestarted.discard(self.config.stop_grace_seconds)
            return False
        if prestarted.control is not None:  # a kept gang node's: its channel is the node's from now on
            old, self.control = self.control, prestarted.control
            self.control.on_message = self.on_control
            if old is not None:
                old.close()
        for hello in prestarted.hellos:  # said before this attempt began: what a stop's progress names
            self.stop_progress.on_message(hello)
            if isinstance(hello.get("pid"), int):
                self.trainee_pids.add(hello["pid"])
        self.current, self.output_tail = prestarted.supervisor, prestarted.tail
        self.adopted = prestarted  # still told what its process says: ``waiting`` may come later (slow imports)
        self.training_pid = prestarted.pid
        if prestarted.hello and self.drill is not None:
            self.drill.on_hello()
        return True

    def _end_prefetch(self, wait_for: int | None = None) -> None:
        """Let the prefetch finish the step this attempt resumes from (the restore reads it locally), then stop
        it: the job's own process has the node's bandwidth from now on."""
        prefetch, self.prefetch = self.prefetch, None
        if prefetch is None:
            return
        if wait_for is not None:
            started = time.monotonic()
            done = prefetch.wait_for(wait_for, PREFETCH_WAIT_SECONDS)
            log.info("checkpoint prefetch", step=wait_for, complete=done, waited_s=round(time.monotonic() - started, 2),
                     fetched_mb=round(prefetch.fetched_bytes / 1e6, 1))
        prefetch.stop()

    def _run_attempts(self, setup_done: bool = False) -> None:
        """Setup once, then the run command; a resume drill continues on this node as the next attempt."""
        first = not setup_done
        while True:
            offset = self.reporter.patiently(lambda: self.client.get("/v1/agent/logs/offset")["offset"],
                                             "log offset")
            self.shipper = LogShipper(self.client, offset, local_copy=self.local_log).start()
            if self.setup_output is not None:  # a prepared replacement's setup ran before this attempt existed
                self.setup_output.hand_over(self.shipper)
                self.setup_output = None
            self.gang.reset()
            self.ranks_finished = None
            self.trainee_pids = set()
            self.elastic.reset()
            self.stop_progress.reset()
            reason, code, message, drill = self._run_job_or_why_not(with_setup=first)
            first = False
            if self.control is not None:
                self.control.drain()  # commits the job reported reach the controller before its exit does
            if not self.shipper.close(timeout=60):
                log.error("some output could not reach the controller", kept_in=str(self.local_log.name))
            if not self.part_reported:  # (a node whose part was done did not stop for a peer, whatever came after)
                reason = self.gang.exit_reason(reason)
            reply = self.reporter.report_exit(reason, code, message, drill, failure_kind=self.failure_kind)
            self.failure_kind = None
            if not (reply and (reply.get("action") == "stay" or reply.get("next"))):
                self._end_prefetch()  # no next attempt here: a fill-in under way is of no use
            if reply and reply.get("action") == "stay":  # a gang node kept for the next attempt, on this node
                log.info("kept for the gang's next attempt; registering for it")
                assignment = register_for_attempt(self.reporter.register, self.address, self.shutdown)
                if assignment is None:
                    self._end_prefetch()
                    return
                self.assignment = assignment
                log.info("registered", job=assignment["job_id"], attempt=assignment["attempt"])
                continue
            if not (reason == EndReason.DRILL and reply and reply.get("next")):
                return
            self.assignment = reply["next"]
            log.info("resume drill: restarting on this node", attempt=self.assignment["attempt"])

    def _start_control_channel(self) -> ControlServer | None:
        try:
            return self.open_control_channel()
        except OSError as exc:
            log.error("control channel unavailable; the job gets signals only",
                      path=str(self.config.control_socket), error=str(exc))
            return None

    # --- lifecycle ----------------------------------------------------------
    def _run_job_or_why_not(self, with_setup: bool) -> tuple[str, int | None, str | None, dict | None]:
        """Run the job; one that cannot even start (its workdir, its command line) fails, saying why in its output."""
        try:
            return self._run_job(self._prepare_workdir(), with_setup)
        except JobCannotStart as exc:
            log.error("the job cannot start", why=str(exc))
            self.shipper.write(f"[runner] {exc}\n".encode())
            return EndReason.FAILED, None, str(exc), None

    def _run_job(self, workdir: Path, with_setup: bool) -> tuple[str, int | None, str | None, dict | None]:
        env = self._environment()
        setup = self.assignment.get("setup")
        if setup and with_setup and (step := resume_step(self.assignment)) is not None:
            # A new node resuming a checkpoint: fetch it while setup runs (agents/prefetch.py).
            root = local_checkpoint_root(self.assignment, self.config.scratch_dir)
            self.prefetch = prefetch_for(self.assignment, root, target=step)
        if setup and with_setup:  # once per node: a new node runs it, a kept gang node or a drill's restart does not
            self.phase = "setup"
            code = self._run_setup_reported(workdir, env)
            if self.cancelled.is_set() or code != 0:
                self._end_prefetch()
            if self.cancelled.is_set():
                return self.stop_reason, code, None, None
            if code != 0:
                return EndReason.FAILED, code, f"setup failed with exit code {code}", None
            self._end_prefetch(wait_for=resume_step(self.assignment))
        elif with_setup:  # a job without setup: this new node is ready at once (0 s of setup, not unknown)
            now = time.time()
            self.reporter.event(EventKind.SETUP, wire.SetupReport(now, now).to_json())
        self.phase = "running"
        self.training_pid = None
        self.drill = ResumeDrill(self.send_control, self._child(), timeout=self.config.drill_timeout_seconds,
                                 restore_timeout=self.config.drill_restore_timeout_seconds)
        expected = self.assignment.get("drill_expected_step")
        started = time.monotonic()
        if not with_setup:  # a kept gang node: the other nodes' share of the step it resumes, fetched since the stop
            self._end_prefetch(wait_for=resume_step(self.assignment))
        if not self._adopt_prestarted():
            self._start_command(self.assignment["run"], workdir, env)
        gang = self.assignment.get("gang") or {}
        self.launcher_watch = watch_launcher(self) if gang.get("elastic") or gang.get("num_nodes", 1) > 1 else None
        self.ranks_finished = watch_ranks_finished(self)
        if expected is not None:
            threading.Thread(target=self._verify_drill, args=(expected, started), daemon=True).start()
        elif self.assignment.get("resume_drill_seconds") is not None:
            self.drill.arm(self.assignment["resume_drill_seconds"],
                           may_run=lambda: not (self.emergency.active or self.cancelled.is_set()))
        code = self.current.wait()
        self.drill.disarm()
        for watch in (self.launcher_watch, self.ranks_finished):
            if watch is not None:
                watch.close()
        log.info("process exited", code=code, phase=self.phase)
        if self.drill.skipped and not (self.emergency.active or self.cancelled.is_set()):
            log.warning("resume drill skipped", why=self.drill.skipped)
            self.reporter.drill({"passed": None, "message": self.drill.skipped})
        if self.part_reported:  # whatever ended the launcher since (the attempt's end, a shutdown, the deadline)
            return EndReason.SUCCEEDED, 0, ("every training process finished and exited during the notice; the node "
                                            "reported its part done while its launcher stayed for the other nodes "
                                            f"(the launcher's exit code {code})"), None
        if self.emergency.active:
            over = self._training_over_at_the_stop(code)
            if over is None:
                return EndReason.PREEMPTED, code, self._stop_summary(), None
            log.info("the job ended during the notice: its training was over before the stop", code=code)
            return EndReason.SUCCEEDED, 0, over or None, None
        if self.cancelled.is_set():
            return self.stop_reason, code, None, None
        if self.drill.triggered:
            return EndReason.DRILL, code, None, self.drill.outcome()
        if self.launcher_watch is not None and self.launcher_watch.finished_training:
            # (a gang's stop for a peer is reported as such: GangRanks.exit_reason)
            return EndReason.SUCCEEDED, 0, ("every training process closed; the launcher, left waiting at its exit for "
                                            f"other nodes, was ended (its exit code {code})"), None
        if code == 0:
            return EndReason.SUCCEEDED, code, None, None
        failure = classify(code, self.output_tail.text() if self.output_tail else "",
                           hide=(self.assignment.get("env") or {}).values())
        self.failure_kind = failure[0] if failure else None
        if failure:
            log.error("the job failed in a way no relaunch can fix", kind=failure[0], why=failure[1])
        return EndReason.FAILED, code, failure[1] if failure else signal_death(code), None

    @property
    def part_reported(self) -> bool:
        """Did this node report its part of the attempt done while its launcher ran (node 0 on notice)?"""
        return self.ranks_finished is not None and self.ranks_finished.reported

    def _training_over_at_the_stop(self, code: int | None) -> str | None:
        """Whether the notice's stop found the training over (every local rank closed after its last step, none
        answering the stop): "" when the job's process then exited 0 by itself, a sentence when the stop ended what
        still ran at the deadline's margin; None when it was a stop (a preemption)."""
        if self.emergency.ack is not None or not self.stop_progress.done_training():
            return None
        if code == 0:
            return ""
        if self.launcher_watch is not None and self.launcher_watch.finished_training:
            return ("every training process closed after its last step during the notice and exited; the launcher, "
                    f"left waiting at its exit, was ended (its exit code {code})")
        if self.emergency.stop.training_was_over:
            return ("every training process closed after its last step during the notice; the job's process, still "
                    f"running at the deadline, was ended (its exit code {code})")
        return None

    def _stop_summary(self) -> str:
        """The emergency's line for the restart log, naming the local ranks that never reached the stop step."""
        text = self.emergency.summary()
        laggards = self.stop_progress.laggards()
        if laggards:
            checkpoint = self.progress.get("checkpoint_step")
            text += f"; {laggards}; the next attempt resumes from the last committed checkpoint" + (
                f" (step {checkpoint})" if checkpoint else "")
        return text

    def _verify_drill(self, expected: int, started: float) -> None:
        result = self.drill.verify_resume(expected, started)
        if self.control is not None and result.get("passed"):  # every local rank's restore, not just the first
            self.gang.wait_restored(len(self.control.trainees()), self.drill.restore_timeout)
        result = self.gang.drill_verdict(result, expected)
        log.info("resume drill verdict", **result)
        reply = self.reporter.drill(result)
        if reply and reply.get("action") == "shutdown":
            self.cancelled.set()
            self.current.stop(self.config.stop_grace_seconds)

    def _run_setup_reported(self, workdir: Path, env: dict) -> int:
        """The job's setup on this new node, its start and end reported for the ledger (0 s without one)."""
        setup = self.assignment.get("setup")
        started = time.time()
        if not setup:
            self.reporter.event(EventKind.SETUP, wire.SetupReport(started, started).to_json())
            return 0
        self.reporter.event(EventKind.SETUP, wire.SetupReport(started).to_json())
        code = None
        try:
            code = self._run_command(setup, workdir, env)
        finally:
            ended = max(started, time.time())
            self.reporter.event(EventKind.SETUP, wire.SetupReport(started, ended, code).to_json())
        return code

    def _run_command(self, command: str, workdir: Path, env: dict) -> int:
        """The node's setup: what it leaves running is left for the attempts that follow on this node."""
        self._start_command(command, workdir, env, end_leftovers=False)
        code = self.current.wait()
        log.info("process exited", code=code, phase=self.phase)
        return code

    def _start_command(self, command: str, workdir: Path, env: dict, end_leftovers: bool = True) -> None:
        self.output_tail = OutputTail(self.shipper)  # its last lines tell a failure no relaunch can fix
        self.current = Supervisor(command, str(workdir), env, self.output_tail, end_leftovers=end_leftovers)
        try:
            self.current.start()
        except (OSError, ValueError) as exc:  # E2BIG, a NUL byte, a missing bash: no process to wait for
            self.current = None
            key = "setup" if self.phase == "setup" else "run"
            raise JobCannotStart(f"the job's {key} command could not be started: {exc}") from None

    def _prepare_workdir(self) -> Path:
        workdir = self.config.scratch_dir / "work"
        workdir.mkdir(parents=True, exist_ok=True)
        if self.assignment.get("has_workdir") and not any(workdir.iterdir()):
            data = self.reporter.patiently(lambda: self.client.get("/v1/agent/workdir"), "workdir")
            try:
                with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
                    extract_safely(tar, workdir)
            except (tarfile.TarError, OSError) as exc:
                raise JobCannotStart(f"the workdir could not be unpacked on the node: {exc}") from None
        return workdir

    def _environment(self, assignment: dict | None = None, control_path: str | None = None) -> dict[str, str]:
        """The node's environment less the agent's own RUNNER_* variables, the job file's ``env``, then the job's
        RUNNER_* variables (runner/protocol/environment.py); of ``assignment`` (default: this attempt's)."""
        assignment = assignment or self.assignment
        env = {k: v for k, v in os.environ.items() if not k.startswith(environment.PREFIX)}
        env.update(assignment.get("env") or {})
        local_dir = assignment["checkpoint"]["local_dir"] or str(self.config.scratch_dir / "checkpoints")
        if control_path is None and self.control is not None:
            control_path = str(self.control.path)
        env.update(environment.job_environment(assignment, local_dir, control_path))
        env["PYTHONUNBUFFERED"] = "1"
        return env

    # --- control --------------------------------------------------------------
    def _status(self) -> dict:
        if self.elastic.changed:
            self.progress.pop("joining", None)  # a joiner is in its world: the controller need not look again
        return {"phase": self.phase, "progress": self.progress, "generation": self.elastic.delivered}

    def _on_world_changed(self, message: dict) -> None:
        self.elastic.on_world_changed(message)

    def _report_world(self, body: dict) -> None:
        self.reporter.patiently(lambda: self.client.post("/v1/agent/world", body), "world report")

    def _child(self) -> ChildProcess:
        """The job's current process, as a stop with a checkpoint reaches it."""
        return ChildProcess(lambda: self.current, lambda: self.training_pid, self.stop_progress.done_training)

    def _heartbeat_interval(self) -> float:
        """The configured interval; shorter while a notice is trained through and the controller's word (the
        replacement is ready) is awaited: it comes on a heartbeat's reply, and every second of waiting for it is
        a second of the deadline's reserve gone."""
        through = self.train_through
        if through is not None and through.awaiting_word:
            return min(self.config.heartbeat_seconds, NOTICE_HEARTBEAT_SECONDS)
        if self.progress.get("joining") or self.elastic.awaits_growth((self.assignment.get("gang") or {}).get("job_num_nodes")):
            return min(self.config.heartbeat_seconds, ELASTIC_HEARTBEAT_SECONDS)
        return self.config.heartbeat_seconds

    def _on_action(self, action: str) -> None:
        if action == Action.CHECKPOINT_NOW and self.train_through is not None:
            self.train_through.checkpoint_now()  # the replacement is ready (or none is coming)
        if action == Action.PEERS_EXITED:
            self.gang.on_peers_exited()  # (the launcher watch ends a launcher left waiting at its exit)
        if action == Action.STOP_FOR_PEER and self.current is not None and self.gang.on_stop_for_peer():
            log.info("the gang's attempt ended elsewhere; stopping the job here to restart with the gang")
            plan = StopPlan(None, self.config.stop_grace_seconds,  # its ranks stopped at the gang's checkpoint
                            exit_times=lambda acked, left: (0.0, self.config.stop_grace_seconds))
            self._stop_in_background(StopWithCheckpoint(self.send_control, self._child(), what="stop for a peer"),
                                     plan)
        if action in JOB_STOPPING_ACTIONS:
            self._stop_for_controller(action)

    def _stop_for_controller(self, action: str) -> None:
        """A cancel, a shutdown, a move to spot: the job stops with a checkpoint, and ends for that reason."""
        if self.cancelled.is_set():
            return
        log.info("stopping the job", why=action)
        if action == Action.MOVE_TO_SPOT:  # the cost policy moves the job to spot: the same stop, another end
            self.stop_reason = EndReason.MOVED
        self.cancel_stop = StopWithCheckpoint(self.send_control, self._child(), what=f"checkpoint and stop for {action}")
        self.cancelled.set()
        if self.current is not None:
            self._stop_in_background(self.cancel_stop, cancel_plan(action, self.config.stop_grace_seconds))

    @staticmethod
    def _stop_in_background(stop: StopWithCheckpoint, plan: StopPlan) -> None:
        threading.Thread(target=stop.run, args=(plan,), name="stop", daemon=True).start()

    def on_control(self, message: dict) -> None:
        for ahead in (self.prestarted, self.adopted):  # a process started ahead of its attempt hears it all
            # (one on a channel of its own, a kept gang node's, hears only that channel until it is adopted)
            if ahead is not None and (ahead.control is None or ahead is self.adopted):
                ahead.on_control(message)
        super().on_control(message)

    def _on_hello(self, message: dict) -> None:
        if (self.assignment.get("gang") or {}).get("elastic_join") and not self.elastic.changed:
            # Its training waits for its world: the gang may let it in now. Said at once, not at the next beat: the
            # controller issues the world in its answer (runner/controller/heartbeat_api.py).
            self.progress["joining"] = True
            self.reporter.beat_now()
        self.elastic.on_hello(message)
        self.training_pid = message.get("pid")
        if isinstance(message.get("pid"), int):
            self.trainee_pids.add(message["pid"])
        if self.drill is not None:
            self.drill.on_hello()

    def _on_restored(self, message: dict) -> None:
        self.gang.on_restored(message)
        if self.drill is not None:
            self.drill.on_restored(message)
        super()._on_restored(message)

    def stops_answered_by(self, message: dict) -> list:
        """A stop the controller asked for takes every ``stopping``; then the emergency, once started, or else a
        resume drill under way; a stop that came from a peer answers none of this node's requests."""
        stops = [self.cancel_stop] if self.cancel_stop is not None else []
        from_peer = self.gang.on_stopping(message)
        if self.emergency.active:
            return stops + [self.emergency]
        if self.drill is not None and self.drill.triggered:
            return stops + [self.drill.stop]
        return stops if from_peer else stops + [self.emergency]

    def _on_sigterm(self) -> None:
        """The node is shutting down (systemd, or GCP's ACPI soft-off): treat it as a notice."""
        log.warning("SIGTERM: the node is shutting down; emergency checkpoint")
        notice = Notice.create("signal", "termination", "shutdown", terminal=True, grace=SHUTDOWN_GRACE_SECONDS)
        threading.Thread(target=self.on_notice, args=(notice,), daemon=True).start()
