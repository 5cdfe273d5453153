"""What an agent reports (``POST /v1/agent/events`` kinds), why an attempt ended, and why an agent's job ended."""

from __future__ import annotations

from .enums import StrEnum


class EventKind(StrEnum):
    """An agent report's ``kind``."""

    NOTICE = "notice"                        # a terminal notice (and whether the agent trains on through it)
    REBALANCE = "rebalance"                  # non-terminal notices, by their kind
    MAINTENANCE = "maintenance"
    CHECKPOINT = "checkpoint"                # a commit (only durable ones are kept)
    CHECKPOINT_FAILED = "checkpoint_failed"
    RESTORED = "restored"
    TELEMETRY = "telemetry"                  # the training's figures, batched by the library
    MANIFEST = "manifest"                    # the run manifest, once per attempt
    SETUP = "setup"                          # the job's setup on the node: at its start and at its end
    HANDOVER = "handover"                    # the emergency checkpoint is durable: launch the next attempt now
    READY = "ready"                          # a prepared replacement has run setup
    PRESTART = "prestart"                    # a gang node's next attempt started ahead: started, waiting, failed
    # A gang node on notice whose training processes have all finished and exited while its launcher still runs
    # (node 0's hosts the store the other launchers' exit barrier waits on): its part of the attempt succeeded. The
    # exit report follows when the launcher exits, and changes nothing of that.
    RANKS_FINISHED = "ranks_finished"
    MESSAGE = "message"


NOTICE_KINDS = (EventKind.NOTICE, EventKind.REBALANCE, EventKind.MAINTENANCE)  # the reports of a cloud's notice


class EndReason(StrEnum):
    """Why an attempt ended (the restart log's ``end_reason``), why an agent's job ended (its exit report's
    ``reason``), and a gang node's end (a restart-log row's ``nodes``)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    PREEMPTED = "preempted"
    LOST = "lost"                 # the node went away without a report
    DRILL = "drill"
    CANCELLED = "cancelled"
    MOVED = "moved"               # stopped with a checkpoint to move the job from on-demand back to spot
    RUNNING = "running"           # not ended yet
    STOPPED_BY_PEER = "stopped-by-peer"  # (agent) another node of the gang stopped; this one stays
    KEPT = "kept"                 # (gang node) carries on into the next attempt
    RELEASED = "released"         # (gang node) healthy, but given up: the gang moved zone, the job ended, or its part
    #                               was done before the attempt ended otherwise (it goes: on notice, or gone)

    @property
    def ends_attempt(self) -> bool:
        """Is it an attempt's end reason in the restart log?"""
        return self in ATTEMPT_END_REASONS

    @property
    def reported_by_agent(self) -> bool:
        """May an agent's exit report give it?"""
        return self in AGENT_EXIT_REASONS


ATTEMPT_END_REASONS = frozenset({EndReason.SUCCEEDED, EndReason.FAILED, EndReason.PREEMPTED, EndReason.LOST,
                                 EndReason.DRILL, EndReason.CANCELLED, EndReason.MOVED})
AGENT_EXIT_REASONS = (EndReason.SUCCEEDED, EndReason.FAILED, EndReason.PREEMPTED, EndReason.CANCELLED,
                      EndReason.DRILL, EndReason.STOPPED_BY_PEER, EndReason.MOVED)


class FailureKind(StrEnum):
    """A failed exit's kind when no relaunch can fix it (agents/failure_kind.py): the attempt ends FAILED at once."""

    COMMAND_NOT_FOUND = "command-not-found"
    IMPORT_ERROR = "import-error"
    CUDA_OOM = "cuda-oom"
    CHECKPOINT_MISMATCH = "checkpoint-mismatch"  # the checkpoint does not fit the job's model or objects
