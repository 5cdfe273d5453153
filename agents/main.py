"""The agent's life on one node: register, fetch the workdir, run setup and run, report the end."""

from __future__ import annotations

import io
import os
import signal
import tarfile
import tempfile
import threading
import time
from pathlib import Path

import structlog

from runner import sdnotify
from runner.client import Client, ClientError
from runner.logconfig import configure_logging

from .config import AgentConfig, AgentConfigError, load_agent_config
from .control import ControlServer
from .drill import ResumeDrill
from .emergency import EmergencyStop, rebalance_message
from .logship import LogShipper
from .supervisor import Supervisor
from .watchers import NoMetadataServer, Notice, WatchLoop, detect, endpoint_for, watchers_for

log = structlog.get_logger(__name__)
REGISTER_PATIENCE_SECONDS = 300.0
SHUTDOWN_GRACE_SECONDS = 25.0  # SIGTERM at shutdown: GCP powers off ~30 s later


def run_agent(config_path: Path) -> int:
    try:
        config = load_agent_config(config_path)
    except AgentConfigError as exc:
        print(f"error: {exc}")
        return 2
    configure_logging(config.scratch_dir.parent / "agent.jsonl")
    return Agent(config).run()


def control_socket_path(scratch_dir: Path, node_id: str) -> Path:
    """The control socket in the scratch folder, or under /tmp when that path is too long for AF_UNIX."""
    path = scratch_dir / "control.sock"
    if len(str(path).encode()) < 100:
        return path
    return Path(tempfile.gettempdir()) / f"runner-{node_id}.sock"


class Agent:
    def __init__(self, config: AgentConfig):
        self.config = config
        self.client = Client(config.controller_url, config.token, timeout=10)
        self.cancelled = threading.Event()
        self.shutdown = threading.Event()
        self.progress: dict = {}
        self.current: Supervisor | None = None
        self.phase = "starting"
        self.training_pid: int | None = None
        self.control: ControlServer | None = None
        self.emergency: EmergencyStop | None = None
        self.drill: ResumeDrill | None = None

    def run(self) -> int:
        sdnotify.start_watchdog()  # also keeps NOTIFY_SOCKET out of the job's environment
        assignment = self._register()
        if assignment is None:
            return 1
        self.assignment = assignment
        log.info("registered", job=assignment["job_id"], attempt=assignment["attempt"])
        self.local_log = open(self.config.scratch_dir / "job.log", "ab")
        self.control = self._start_control_channel()
        self.emergency = EmergencyStop(send=self._send_control, supervisor=lambda: self.current,
                                       training_pid=lambda: self.training_pid)
        self.watch_loop = self._start_watchers()
        signal.signal(signal.SIGTERM, lambda *_: self._on_sigterm())
        threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True).start()
        sdnotify.ready()
        try:
            self._run_attempts()
        finally:
            sdnotify.stopping()
            self.shutdown.set()
            if self.watch_loop is not None:
                self.watch_loop.stop()
            if self.control is not None:
                self.control.close()
        return 0

    def _run_attempts(self) -> None:
        """Setup once, then the run command; a resume drill continues on this node as the next attempt."""
        workdir = self._prepare_workdir()
        first = True
        while True:
            offset = self._patiently(lambda: self.client.get("/v1/agent/logs/offset")["offset"], "log offset")
            self.shipper = LogShipper(self.client, offset, local_copy=self.local_log).start()
            reason, code, message, drill = self._run_job(workdir, with_setup=first)
            first = False
            if self.control is not None:
                self.control.drain()  # commits the job reported reach the controller before its exit does
            if not self.shipper.close(timeout=60):
                log.error("some output could not reach the controller", kept_in=str(self.local_log.name))
            reply = self._report_exit(reason, code, message, drill)
            if not (reason == "drill" and reply and reply.get("next")):
                return
            self.assignment = reply["next"]
            log.info("resume drill: restarting on this node", attempt=self.assignment["attempt"])

    def _send_control(self, message: dict) -> int:
        return self.control.send(message) if self.control is not None else 0

    def _start_control_channel(self) -> ControlServer | None:
        path = control_socket_path(self.config.scratch_dir, self.config.node_id)
        try:
            return ControlServer(path, self._on_control).start()
        except OSError as exc:
            log.error("control channel unavailable; the job gets signals only", path=str(path), error=str(exc))
            return None

    def _start_watchers(self) -> WatchLoop | None:
        """Watch the cloud's preemption signals: the endpoint variables, else the link-local address."""
        if self.config.watch == "off":
            return None
        try:
            endpoints = detect() if self.config.watch == "auto" else {self.config.watch: endpoint_for(self.config.watch)}
        except NoMetadataServer:
            log.info("no cloud metadata server: preemption notices are not watched")
            return None
        state = self.config.scratch_dir.parent / "notice.json"
        return WatchLoop(watchers_for(endpoints), self._on_notice, state_path=state).start()

    def _patiently(self, call, what: str):
        """Retry a call while the controller is unreachable or restarting; other errors raise."""
        deadline = time.monotonic() + REGISTER_PATIENCE_SECONDS
        while True:
            try:
                return call()
            except ClientError as exc:
                if (exc.status is not None and exc.status < 500) or time.monotonic() > deadline:
                    raise
                log.warning("controller not reachable; retrying", what=what, error=str(exc))
                time.sleep(2)

    # --- lifecycle ----------------------------------------------------------
    def _register(self) -> dict | None:
        deadline = time.monotonic() + REGISTER_PATIENCE_SECONDS
        while time.monotonic() < deadline:
            try:
                return self.client.post("/v1/agent/register")
            except ClientError as exc:
                if exc.status in (401, 403, 409):
                    log.error("registration refused", error=str(exc))
                    return None
                log.warning("controller not reachable yet", error=str(exc))
                time.sleep(2)
        return None

    def _run_job(self, workdir: Path, with_setup: bool) -> tuple[str, int | None, str | None, dict | None]:
        env = self._environment()
        setup = self.assignment.get("setup")
        if setup and with_setup:
            self.phase = "setup"
            code = self._run_command(setup, workdir, env)
            if self.cancelled.is_set():
                return "cancelled", code, None, None
            if code != 0:
                return "failed", code, f"setup failed with exit code {code}", None
        self.phase = "running"
        self.training_pid = None
        self.drill = ResumeDrill(self._send_control, lambda: self.current, lambda: self.training_pid is not None,
                                 timeout=self.config.drill_timeout_seconds)
        expected = self.assignment.get("drill_expected_step")
        started = time.monotonic()
        self._start_command(self.assignment["run"], workdir, env)
        if expected is not None:
            threading.Thread(target=self._verify_drill, args=(expected, started), daemon=True).start()
        elif self.assignment.get("resume_drill_seconds") is not None:
            self.drill.arm(self.assignment["resume_drill_seconds"],
                           may_run=lambda: not (self.emergency.active or self.cancelled.is_set()))
        code = self.current.wait()
        self.drill.disarm()
        log.info("process exited", code=code, phase=self.phase)
        if self.drill.skipped:
            self._post_drill({"passed": None, "message": self.drill.skipped})
        if self.emergency.active:
            return "preempted", code, self._preemption_message(), None
        if self.cancelled.is_set():
            return "cancelled", code, None, None
        if self.drill.triggered:
            return "drill", code, None, self.drill.outcome()
        return ("succeeded" if code == 0 else "failed"), code, None, None

    def _verify_drill(self, expected: int, started: float) -> None:
        result = self.drill.verify_resume(expected, started)
        log.info("resume drill verdict", **result)
        reply = self._post_drill(result)
        if reply and reply.get("action") == "shutdown":
            self.cancelled.set()
            self.current.stop(self.config.stop_grace_seconds)

    def _post_drill(self, result: dict) -> dict | None:
        try:
            return self.client.post("/v1/agent/drill", result)
        except ClientError as exc:
            log.error("drill result not delivered", error=str(exc))
            return None

    def _preemption_message(self) -> str:
        ack = self.emergency.ack
        if ack is None:
            return "preempted: the job did not acknowledge the emergency checkpoint before the deadline"
        where = "durable" if ack.get("durable") else "local only (not durable before the deadline)"
        return f"preempted: emergency checkpoint at step {ack.get('step')}, {where}"

    def _run_command(self, command: str, workdir: Path, env: dict) -> int:
        self._start_command(command, workdir, env)
        code = self.current.wait()
        log.info("process exited", code=code, phase=self.phase)
        return code

    def _start_command(self, command: str, workdir: Path, env: dict) -> None:
        self.current = Supervisor(command, str(workdir), env, self.shipper)
        self.current.start()

    def _prepare_workdir(self) -> Path:
        workdir = self.config.scratch_dir / "work"
        workdir.mkdir(parents=True, exist_ok=True)
        if self.assignment.get("has_workdir") and not any(workdir.iterdir()):
            data = self._patiently(lambda: self.client.get("/v1/agent/workdir"), "workdir")
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
                tar.extractall(workdir, filter="data")
        return workdir

    def _environment(self) -> dict[str, str]:
        checkpoint = self.assignment["checkpoint"]
        local_dir = checkpoint["local_dir"] or str(self.config.scratch_dir / "checkpoints")
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUNNER_")}
        env.update(self.assignment.get("env") or {})
        resume = checkpoint.get("resume") or {}
        if resume.get("step"):
            env["RUNNER_RESUME_STEP"] = str(resume["step"])
        env.update({
            "RUNNER_JOB_ID": self.assignment["job_id"],
            "RUNNER_ATTEMPT": str(self.assignment["attempt"]),
            "RUNNER_CHECKPOINT_DIR": local_dir,
            "RUNNER_CHECKPOINT_URL": checkpoint["durable_url"],
            "PYTHONUNBUFFERED": "1",
        })
        if self.control is not None:
            env["RUNNER_CONTROL"] = str(self.control.path)
        if checkpoint.get("interval") and checkpoint["interval"] != "auto":
            env["RUNNER_CHECKPOINT_INTERVAL"] = str(checkpoint["interval"])
        env["RUNNER_CHECKPOINT_KEEP"] = str(checkpoint.get("keep", 3))
        return env

    def _report_exit(self, reason: str, code: int | None, message: str | None, drill: dict | None) -> dict | None:
        body = {"reason": reason, "exit_code": code, "message": message, "drill": drill}
        for _ in range(60):
            try:
                reply = self.client.post("/v1/agent/exit", body)
                log.info("exit reported", reason=reason, code=code)
                return reply
            except ClientError as exc:
                if exc.status and exc.status < 500:
                    log.error("exit report refused", error=str(exc))
                    return None
                log.warning("exit report failed; retrying", error=str(exc))
                time.sleep(2)
        return None

    # --- control --------------------------------------------------------------
    def _heartbeat_loop(self) -> None:
        while not self.shutdown.is_set():
            try:
                reply = self.client.post("/v1/agent/heartbeat", {"phase": self.phase, "progress": self.progress})
            except ClientError as exc:
                log.warning("heartbeat failed", error=str(exc))
                reply = {"action": "continue"}
            if reply["action"] in ("cancel", "shutdown") and not self.cancelled.is_set():
                log.info("stopping the job", why=reply["action"])
                self.cancelled.set()
                if self.current is not None:
                    threading.Thread(target=self.current.stop, args=(self.config.stop_grace_seconds,),
                                     daemon=True).start()
            self.shutdown.wait(self.config.heartbeat_seconds)

    def _on_notice(self, notice: Notice) -> None:
        """A new notice from the watch loop: record it; a terminal one starts the emergency path."""
        data = {**notice.to_json(), **notice.timing()}
        if notice.terminal:
            self._event("notice", data)
            self.emergency.start(notice)
        else:
            self._event(notice.kind, {"message": f"{notice.source} {notice.kind} ({notice.action}): "
                                                 "taking an opportunistic checkpoint", **data})
            if self.control is not None:
                self.control.send(rebalance_message(notice))

    def _on_control(self, message: dict) -> None:
        op = message.get("op")
        if op == "hello":
            self.training_pid = message.get("pid")
        elif op == "stopping":
            if self.drill is not None and self.drill.triggered and not self.emergency.active:
                self.drill.on_stopping(message)
            else:
                self.emergency.on_ack(message)
        elif op == "committed":
            self.progress["checkpoint_step"] = message.get("step")
            self._event("checkpoint", {k: message.get(k) for k in
                                       ("step", "manifest", "durable", "emergency", "seconds", "bytes")})
        elif op == "restored":
            self.progress["restored_step"] = message.get("step")
            if self.drill is not None:
                self.drill.on_restored(message)
            step = message.get("step") or 0
            text = f"training resumed from step {step}" if step else "training started fresh (no checkpoint yet)"
            self._event("restored", {"message": text})

    def _event(self, kind: str, data: dict) -> None:
        try:
            self.client.post("/v1/agent/events", {"kind": kind, "data": data})
        except ClientError as exc:
            log.warning("event not delivered", kind=kind, error=str(exc))

    def _on_sigterm(self) -> None:
        """The node is shutting down (systemd, or GCP's ACPI soft-off): treat it as a notice."""
        log.warning("SIGTERM: the node is shutting down; emergency checkpoint")
        notice = Notice.create("signal", "termination", "shutdown", terminal=True, grace=SHUTDOWN_GRACE_SECONDS)
        threading.Thread(target=self._on_notice, args=(notice,), daemon=True).start()
