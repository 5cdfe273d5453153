"""What the controller answers an agent: a heartbeat's ``action`` (and an exit or drill report's), and the
registration's ``status``."""

from __future__ import annotations

from .enums import StrEnum


class Action(StrEnum):
    """``{"action": ...}`` in the answer to a heartbeat, an exit report or a drill report."""

    CONTINUE = "continue"
    CANCEL = "cancel"                # the user cancelled the job: stop it with a checkpoint
    SHUTDOWN = "shutdown"            # this node's attempt is over: stop the job (if any) and exit
    MOVE_TO_SPOT = "move"            # the cost policy moves the job back to spot: a cancel's stop, ending ``moved``
    STOP_FOR_PEER = "stop-for-peer"  # a gang node whose attempt ended elsewhere: stop the job here, stay
    CHECKPOINT_NOW = "checkpoint"    # a node on notice: the replacement is ready (or none is coming), stop now
    # A gang node whose attempt still runs while every other node has reported its exit: once every training process
    # here has closed after its last step and gone, a launcher still waiting at its exit is ended (the nodes it waits
    # for have no launcher left to come), and the node reports succeeded
    PEERS_EXITED = "peers-exited"
    STANDBY_WAIT = "wait"            # a prepared replacement: keep waiting for the handover
    STAY = "stay"                    # (exit report) a gang node kept for the next attempt: register again
    # An elastic gang's world changed: the reply's ``world`` ({"generation", "node_rank", "nnodes", "master_addr",
    # "master_port"}, and "lost": true after a loss) goes to every local rank with ``"op": "world"``; repeated until
    # the heartbeat's ``generation`` says the agent knows it (docs/elastic.md).
    WORLD = "world"

    @property
    def stops_job(self) -> bool:
        """Does the agent stop the job with a checkpoint, ending the attempt for the controller's reason?"""
        return self in JOB_STOPPING_ACTIONS


JOB_STOPPING_ACTIONS = frozenset({Action.CANCEL, Action.SHUTDOWN, Action.MOVE_TO_SPOT})


class RegisterStatus(StrEnum):
    """``{"status": ...}`` in the answer to ``/v1/agent/register`` when it is not an assignment."""

    WAITING = "waiting"  # the gang's attempt is not complete (or not planned yet): register again shortly
    PREPARE = "prepare"  # a replacement prepared while the job still trains: setup, report ``ready``, register again
