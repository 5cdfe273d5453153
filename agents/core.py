"""What both modes of the agent share: the control channel, the cloud watchers, and what the cloud and the
training library say, turned into checkpoint requests and reports.

``Agent`` (agents/main.py, supervise mode) and ``Sidecar`` (agents/sidecar.py) build on this; each adds how
its training process is started (or not) and stopped (or not).
"""

from __future__ import annotations

from typing import Callable

import structlog

from runner.protocol.events import EventKind
from runner.protocol.messages import CheckpointRequest, Op, Recorded, StopReason

from .config import AgentConfig
from .control import ControlServer
from .emergency import EmergencyStop, rebalance_message
from .handover import Handover
from .reporter import Reporter
from .telemetry import TelemetryRelay
from .train_through import CheckpointClock, TrainThrough, trains_through
from .watchers import NoMetadataServer, Notice, WatchLoop, detect, endpoint_for, watchers_for

log = structlog.get_logger(__name__)


class AgentCore:
    emergency: EmergencyStop  # built by the mode once it knows its training process

    def __init__(self, config: AgentConfig, reporter: Reporter | None = None):
        self.config = config
        self.reporter = reporter or Reporter.for_config(config)
        self.progress: dict = {}  # what heartbeats carry: the last committed and restored steps
        self.control: ControlServer | None = None
        self.watch_loop: WatchLoop | None = None
        self.telemetry = TelemetryRelay()
        self.handover: Handover | None = None  # supervise mode, single-node jobs: see agents/handover.py
        self.checkpoint_clock = CheckpointClock()  # how long an emergency checkpoint is expected to take
        # Supervise mode: a notice whose deadline leaves time is trained through while the controller prepares
        # the replacement (agents/train_through.py).
        self.may_train_through = False
        self.gang_node = False  # a node of a gang that stops together: its timer stops the gang, never holds
        self.train_through: TrainThrough | None = None
        # What the training library says, by op: each message goes to every handler of its op, in order.
        self._control_handlers: dict[str, list[Callable[[dict], None]]] = {}
        self.on_op(Op.STOPPING, self._on_stopping)
        self.on_op(Op.COMMITTED, self._on_committed)
        self.on_op(Op.FAILED, self._on_failed)
        self.on_op(Op.TELEMETRY, self._on_telemetry)
        self.on_op(Op.MANIFEST, self._on_manifest)
        self.on_op(Op.RESTORED, self._on_restored)

    def on_op(self, op: Op, handler: Callable[[dict], None]) -> None:
        """Hand the library's ``op`` messages to ``handler`` too (after the handlers added before it)."""
        self._control_handlers.setdefault(op.value, []).append(handler)

    def on_control(self, message: dict) -> None:
        for handler in self._control_handlers.get(message.get("op"), ()):
            handler(message)

    def send_control(self, message: dict) -> int:
        return self.control.send(message) if self.control is not None else 0

    def open_control_channel(self) -> ControlServer:
        """Listen on the control socket; raises OSError when it cannot be created."""
        return ControlServer(self.config.control_socket, self.on_control).start()

    def start_watchers(self) -> WatchLoop | None:
        """Watch the cloud's preemption signals: the endpoint variables, else the link-local address."""
        watch = self.config.watch
        if watch == "off":
            return None
        try:
            endpoints = detect() if watch == "auto" else {watch: endpoint_for(watch)}
        except NoMetadataServer:
            log.info("no cloud metadata server: preemption notices are not watched")
            return None
        log.info("watching for preemption notices", endpoints=endpoints)
        state = self.config.state_dir / "notice.json"
        watchers = watchers_for(endpoints, gcp_spot_grace=self.config.gcp_spot_grace_seconds)
        return WatchLoop(watchers, self.on_notice, state_path=state).start()

    def stop_background(self) -> None:
        if self.watch_loop is not None:
            self.watch_loop.stop()
        if self.control is not None:
            self.control.close()

    # --- what the cloud says ------------------------------------------------------
    def on_notice(self, notice: Notice) -> None:
        """A new notice from the watch loop: record it; a terminal one starts the emergency path."""
        data = {**notice.to_json(), **notice.timing()}
        if notice.terminal:
            # One training process uploads its emergency checkpoint from the staged buffer; ranks of a process group
            # write theirs locally first
            self.checkpoint_clock.from_buffer = (self._world_size({}) or 1) == 1
            expected = self.checkpoint_clock.expected()
            through = self.may_train_through and self.train_through is None and trains_through(notice, expected)
            self.reporter.event(EventKind.NOTICE, {**data, "prepare": through,
                                                   "checkpoint_seconds": round(expected, 3)})
            if through:
                # One process times a checkpoint saved the emergency way at each notice, under the node's load of
                # the moment; a gang's ranks only before any timed commit (see agents/train_through.py).
                measure = (lambda: self._measure_a_checkpoint_now(notice)) if (
                    self.checkpoint_clock.from_buffer or not self.checkpoint_clock.measured) else None
                self.train_through = TrainThrough(notice, self.checkpoint_clock.expected, self.emergency.start,
                                                  self.send_control, measure=measure,
                                                  hold=not self.gang_node).start()
            else:
                self.emergency.start(notice)
        else:
            self.reporter.event(notice.kind, {"message": f"{notice.source} {notice.kind} ({notice.action}): "
                                                         "taking an opportunistic checkpoint", **data})
            sent = self.send_control(rebalance_message(notice))
            log.info("opportunistic checkpoint requested", source=notice.source, kind=notice.kind, delivered_to=sent)

    def _measure_a_checkpoint_now(self, notice: Notice) -> None:
        """A timing checkpoint, training on: saved the way the emergency one is, under the node's load of the
        moment, so the emergency checkpoint starts early enough for a state of any size on a busy node; it also
        leaves a durable step from the notice's start should the last one miss the reclaim."""
        sent = self.send_control(CheckpointRequest(StopReason.NOTICE, stop=False, timing=True).to_json())
        log.info("notice: a timing checkpoint now, saved the emergency way", source=notice.source,
                 delivered_to=sent)

    # --- what the training library says -------------------------------------------
    def _recorded_by_controller(self, fields: dict):
        """Tell the library which durable checkpoint the controller has recorded (retention keeps it)."""
        step = fields.get("step")
        if not fields.get("durable") or not isinstance(step, int):
            return None

        def on_delivered(reply: dict) -> None:
            if reply.get("accepted"):
                self.send_control(Recorded(step).to_json())
        return on_delivered

    def _world_size(self, message: dict) -> int | None:
        """The ranks of the training's world, as its processes said in their hello (an elastic gang's first
        world size in the restart log)."""
        hellos = self.control.trainees() if self.control is not None else []
        return message.get("world_size") or next((h["world_size"] for h in hellos if h.get("world_size")), None)

    def stops_answered_by(self, message: dict) -> list:
        """The stops under way that a ``stopping`` answers (each has ``on_ack``)."""
        return [self.emergency]

    def _on_stopping(self, message: dict) -> None:
        for stop in self.stops_answered_by(message):
            stop.on_ack(message)

    def _on_committed(self, message: dict) -> None:
        if message.get("timing_only"):  # another node's commit of the job's checkpoint: its time, for a notice here
            self.checkpoint_clock.observe(message)
            return
        fields = {k: message.get(k) for k in ("step", "manifest", "durable", "emergency", "seconds", "bytes")}
        log.info("checkpoint committed", **{k: fields[k] for k in ("step", "durable", "emergency", "seconds")})
        self.progress["checkpoint_step"] = message.get("step")
        self.checkpoint_clock.observe(message)
        self.reporter.event(EventKind.CHECKPOINT, fields, on_delivered=self._recorded_by_controller(fields))
        if self.handover is not None:  # after the checkpoint's report: the controller learns of it first
            self.handover.on_committed(message)

    def _on_failed(self, message: dict) -> None:
        text = (f"checkpoint of step {message.get('step')} not saved on the {message.get('tier')} tier: "
                f"{message.get('error')}")
        log.warning("checkpoint failed", step=message.get("step"), tier=message.get("tier"),
                    error=message.get("error"))
        self.reporter.event(EventKind.CHECKPOINT_FAILED, {"message": text})

    def _on_telemetry(self, message: dict) -> None:
        report = self.telemetry.update(message)
        if report is not None:
            self.reporter.event(EventKind.TELEMETRY, report)

    def _on_manifest(self, message: dict) -> None:
        log.info("run manifest", commit=(message.get("manifest") or {}).get("git_commit"))
        self.reporter.event(EventKind.MANIFEST, {"manifest": message.get("manifest")})

    def _on_restored(self, message: dict) -> None:
        self.progress["restored_step"] = message.get("step")
        step = message.get("step") or 0
        text = f"training resumed from step {step}" if step else "training started fresh (no checkpoint yet)"
        log.info(text, manifest=message.get("manifest"))
        if message.get("expected") and step < message["expected"]:
            text += f" (the checkpoint of step {message['expected']} was missing or did not verify)"
        self.reporter.event(EventKind.RESTORED, {"message": text, "step": step, "expected": message.get("expected"),
                                                 "world_size": self._world_size(message)})
