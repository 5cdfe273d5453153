"""When a gang's launcher (torchrun) is ended although it has not exited by itself, and when node 0 reports its part
done while its launcher still runs.

A launcher exits only once every node's launcher reaches its exit barrier. Once the training processes it started
have all closed, it is ended where a node it started with may never reach that barrier: the elastic world changed,
the controller says the attempt ended elsewhere (agents/elastic.py), the gang stopped together for a notice, every
other node has reported its exit (``peers-exited``), or this node is on notice with its training over.

Node 0 on notice with its training over is the exception: its launcher hosts the store the other launchers' exit
barrier waits on, so it is not ended; the node reports ``ranks_finished`` instead (its part of the attempt
succeeded), and its launcher stays until the other launchers leave (they reach its barrier and every launcher exits,
or the attempt ends and the controller says ``shutdown`` or ``stop-for-peer``) or the node is reclaimed (or ended at
the deadline less the margin, as any launcher still running then).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import structlog

from runner.protocol.events import EventKind

from . import process_tree
from .elastic import LAUNCHER_LINGER_SECONDS, LauncherWatch
from .held_watch import HeldWatch
from .launcher_interval import launcher_linger
from .supervisor import LEFTOVER_GRACE_SECONDS

if TYPE_CHECKING:
    from .main import Agent

log = structlog.get_logger(__name__)

# A gang's launcher once every local rank has stopped with the gang and closed: ended this soon, and killed this
# soon after its SIGTERM (its exit barrier waits for every node's launcher, the one on notice is being stopped,
# and a launcher in that wait does not act on SIGTERM)
STOPPED_TOGETHER_LINGER_SECONDS = 0.5


def trainees_exited(agent: "Agent") -> bool:
    """Every training process that said hello in this attempt has exited."""
    return not any(process_tree.running(pid) for pid in list(agent.trainee_pids))


def on_notice_with_training_over(agent: "Agent") -> bool:
    """A gang node on notice (it goes at the deadline, and trains on until then) whose training is over: every local
    rank closed its Checkpointer after its last step without error, none stopped for a request, and every training
    process has exited. Its launcher then only waits at its exit barrier, where its own arrival is counted: a launcher
    such as torchrun waits there only once every worker of its node exited 0 (a failed one ends it at once)."""
    on_notice = agent.train_through is not None or agent.emergency.active
    return (agent.gang_node and on_notice and agent.emergency.ack is None and agent.stop_progress.done_training()
            and trainees_exited(agent))


def watch_launcher(agent: "Agent") -> LauncherWatch | None:
    """The watch that ends the agent's current gang launcher once every training process has closed and a node it
    started with may never reach its exit (above); None where the job has no control channel."""
    if agent.control is None:
        return None
    adopted = agent.adopted
    hellos_before, closed_before = adopted.counts_before if adopted is not None else agent.control.counts()

    def trainees_left() -> bool:
        hellos, closed = agent.control.counts()
        return hellos > hellos_before and closed - closed_before >= hellos - hellos_before

    supervisor = agent.current
    # Nothing of the training is left to save, and torchrun blocked at its exit barrier (a wait on its store, in
    # C++) does not act on SIGTERM until the wait ends: a short grace before SIGKILL, not a checkpoint's.
    grace = min(agent.config.stop_grace_seconds, LEFTOVER_GRACE_SECONDS)

    def stopped_together() -> bool:
        """The gang stopped at one step for a notice (this node's, its checkpoint acknowledged, or a peer's) and
        every training process here has exited: nothing is left for its launcher but its exit barrier, which
        holds up the gang's next attempt (a process that lingers after close() is left its own exit)."""
        return (agent.gang_node and (agent.gang.peer_stop is not None or agent.emergency.ack is not None)
                and trainees_exited(agent))

    gang = agent.assignment.get("gang") or {}

    def leaving_with_training_over() -> bool:
        """This node is on notice (it goes at the deadline), its training is over and every training process of
        it has exited: its launcher only waits at its exit barrier, where its arrival is counted by now. Ended
        now, the node reports its success well before the reclaim, not in the deadline's last margin, where the
        report could miss it. Not node 0's: its launcher hosts the store the other launchers' barrier waits on
        (node 0 reports its part instead: :func:`watch_ranks_finished`)."""
        return gang.get("node_rank") != 0 and on_notice_with_training_over(agent)

    def peers_exited() -> bool:
        """Every other node reported its exit while the attempt runs (its launcher gone, barrier reached or not),
        and every training process here closed after its last step and has exited: the job is over here too, and
        its launcher has nothing left but an exit barrier no other launcher may still reach."""
        return agent.gang.peers_exited and agent.stop_progress.done_training() and trainees_exited(agent)

    # (a launcher that looks at its workers seldom is given longer: agents/launcher_interval.py)
    linger = launcher_linger(supervisor)
    return LauncherWatch(lambda: agent.elastic.changed or agent.gang.ended_elsewhere or stopped_together()
                         or peers_exited() or leaving_with_training_over(),
                         trainees_left,
                         lambda: supervisor.stop(STOPPED_TOGETHER_LINGER_SECONDS if stopped_together() else grace),
                         linger=lambda: STOPPED_TOGETHER_LINGER_SECONDS if stopped_together() else linger()).start()


class RanksFinished(HeldWatch):
    """Node 0's report that its part of the attempt is done while its launcher still runs (see the module's doc): once
    the training is over here (``finished``) and the launcher has outlived it ``linger`` seconds (a launcher whose
    worker failed exits once it has looked at its workers, without waiting at its exit barrier: the linger follows how
    often it looks, agents/launcher_interval.py), ``report`` is called, once."""

    def __init__(self, finished: Callable[[], bool], launcher_running: Callable[[], bool],
                 report: Callable[[], None], linger: float | Callable[[], float] = LAUNCHER_LINGER_SECONDS):
        super().__init__(lambda: finished() and launcher_running(), report, linger, "ranks-finished")

    @property
    def reported(self) -> bool:
        return self.acted


def watch_ranks_finished(agent: "Agent") -> RanksFinished | None:
    """Node 0 of a gang (not elastic), whose launcher hosts the store the others' exit barrier waits on: reports
    ``ranks_finished`` once, on notice, its training is over and every training process has exited 0 while the
    launcher waits at its exit barrier. The controller counts that as the node's success for the running attempt, so
    the node's reclaim from then on, its launcher still there, ends nothing; the launcher stays for the others. None
    on any other node (whose launcher is ended then: :func:`watch_launcher`)."""
    gang = agent.assignment.get("gang") or {}
    if not agent.gang_node or gang.get("node_rank") != 0 or agent.control is None:
        return None
    supervisor, attempt = agent.current, agent.assignment.get("attempt")

    def report() -> None:
        log.info("every training process here has finished and exited during the notice; reporting this node's part "
                 "of the attempt as done, its launcher staying for the other nodes' exit")
        agent.reporter.event(EventKind.RANKS_FINISHED,
                             {"message": "every training process of node 0 finished and exited during the notice; its "
                                         "launcher stayed to host the rendezvous store for the other nodes"},
                             on_delivered=lambda reply: _delivered(reply, attempt))

    return RanksFinished(lambda: on_notice_with_training_over(agent),
                         lambda: supervisor is not None and supervisor.process.poll() is None, report,
                         linger=launcher_linger(supervisor)).start()


def _delivered(reply: dict, attempt) -> None:
    if reply.get("accepted"):
        log.info("the controller has this node's part of the attempt as done", attempt=attempt, state=reply.get("state"))
    else:
        log.info("the controller did not take this node's part as done (its attempt had ended, or its exit came first)",
                 attempt=attempt)
