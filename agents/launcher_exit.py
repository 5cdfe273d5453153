"""When a gang's launcher (torchrun) is ended although it has not exited by itself.

A launcher exits only once every node's launcher reaches its exit barrier. Once the training processes it started
have all closed, it is ended where a node it started with may never reach that barrier: the elastic world changed,
the controller says the attempt ended elsewhere (agents/elastic.py), the gang stopped together for a notice, every
other node has reported its exit (``peers-exited``), or this node is on notice with its training over.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import process_tree
from .elastic import LAUNCHER_LINGER_SECONDS, LauncherWatch
from .supervisor import LEFTOVER_GRACE_SECONDS

if TYPE_CHECKING:
    from .main import Agent

# A gang's launcher once every local rank has stopped with the gang and closed: ended this soon, and killed this
# soon after its SIGTERM (its exit barrier waits for every node's launcher, the one on notice is being stopped,
# and a launcher in that wait does not act on SIGTERM)
STOPPED_TOGETHER_LINGER_SECONDS = 0.5


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

    def trainees_exited() -> bool:
        return not any(process_tree.running(pid) for pid in list(agent.trainee_pids))

    def stopped_together() -> bool:
        """The gang stopped at one step for a notice (this node's, its checkpoint acknowledged, or a peer's) and
        every training process here has exited: nothing is left for its launcher but its exit barrier, which
        holds up the gang's next attempt (a process that lingers after close() is left its own exit)."""
        return (agent.gang_node and (agent.gang.peer_stop is not None or agent.emergency.ack is not None)
                and trainees_exited())

    gang = agent.assignment.get("gang") or {}

    def leaving_with_training_over() -> bool:
        """This node is on notice (it goes at the deadline), its training is over and every training process of
        it has exited: its launcher only waits at its exit barrier, where its arrival is counted by now. Ended
        now, the node reports its success well before the reclaim, not in the deadline's last margin, where the
        report could miss it. Not node 0's: its launcher hosts the store the other launchers' barrier waits on."""
        on_notice = agent.train_through is not None or agent.emergency.active
        return (agent.gang_node and on_notice and gang.get("node_rank") != 0 and agent.emergency.ack is None
                and agent.stop_progress.done_training() and trainees_exited())

    def peers_exited() -> bool:
        """Every other node reported its exit while the attempt runs (its launcher gone, barrier reached or not),
        and every training process here closed after its last step and has exited: the job is over here too, and
        its launcher has nothing left but an exit barrier no other launcher may still reach."""
        return agent.gang.peers_exited and agent.stop_progress.done_training() and trainees_exited()

    return LauncherWatch(lambda: agent.elastic.changed or agent.gang.ended_elsewhere or stopped_together()
                         or peers_exited() or leaving_with_training_over(),
                         trainees_left,
                         lambda: supervisor.stop(STOPPED_TOGETHER_LINGER_SECONDS if stopped_together() else grace),
                         linger=lambda: STOPPED_TOGETHER_LINGER_SECONDS if stopped_together()
                         else LAUNCHER_LINGER_SECONDS).start()
