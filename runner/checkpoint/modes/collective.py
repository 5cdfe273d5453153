"""Every rank of a torch.distributed job together: one DCP checkpoint, one decision per step (agreement.py).

Each ``step()`` collects the decision the ranks reached in the previous step's round and starts this step's
round, carrying this rank's request and whether its own clock says a save is due. A save at an
``every_steps`` step needs no round: every rank reaches that step. In an elastic gang (elastic.py) the
round also carries the world-change flag, and collecting it may move this rank to a new process group.
"""

from __future__ import annotations

from .. import elastic as elastic_gang
from ..agreement import Decision, StepAgreement
from ..group import Ranks, check_same_objects
from ..persist import DcpFormat, Persister
from ..schedule import AT_STEP, ON_CLOCK, SaveSchedule, check_step


class Collective:
    """The mode of a rank under torch.distributed.

    What an elastic gang's side (elastic.py) reaches, and may replace when it moves to a new world:
    ``ranks`` (the side groups, rebound in place), ``agreement`` (the step rounds) and ``persister`` (its
    ``folder_leader``). ``elastic`` is that side, None outside an elastic gang."""

    quiet_steps = False  # every step starts a round, wanted or not

    def __init__(self, ranks: Ranks, gang: bool = False) -> None:
        from .. import dcp_format

        self.ranks = ranks
        self.gang = gang  # an elastic gang's rank: the Checkpointer attaches ``elastic``
        self.elastic: elastic_gang.Elastic | None = None
        self.hello = {"rank": ranks.rank, "local_rank": ranks.local_rank, "world_size": ranks.world_size}
        self.stager = dcp_format.Stager(ranks=lambda: (self.ranks.rank, self.ranks.world_size))
        self.agreement = StepAgreement(ranks.steps)
        self.persister: Persister | None = None

    # The world may change under an elastic gang: read through ``ranks`` every time.
    rank = property(lambda self: self.ranks.rank)
    world_size = property(lambda self: self.ranks.world_size)
    folder_leader = property(lambda self: self.ranks.folder_leader)
    comm = property(lambda self: self.ranks.steps)
    writer = property(lambda self: self.ranks.writer)

    @property
    def world_changed(self) -> bool:
        return self.elastic is not None and self.elastic.changed

    @property
    def on_world(self):
        """Where the control channel hands a ``world`` message (None outside an elastic gang)."""
        return self.elastic.on_world if self.elastic is not None else None

    def check_same_setup(self, signature: dict) -> None:
        check_same_objects(self.ranks, signature)

    def make_persister(self, *args, **kwargs) -> Persister:
        self.persister = Persister(*args, writer=self.ranks.writer, uploader=self.ranks.uploader,
                                   fmt=DcpFormat(self.ranks.writer), folder_leader=self.ranks.folder_leader,
                                   **kwargs)
        return self.persister

    def capture(self, step: int, objects: dict, extra: dict) -> dict:
        from ..dcp_format import capture

        return capture(objects, extra, self.ranks.rank)

    @staticmethod
    def replicated(state: dict) -> bool:
        from ..dcp_format import replicated

        return replicated(state)

    def bind(self, take_request, schedule: SaveSchedule, stopped) -> None:
        """Where ``decide`` takes the pending request (a callable), asks whether a save is due, and whether
        the Checkpointer has stopped (an elastic rank out of the gang)."""
        self._take_request, self._schedule, self._stopped = take_request, schedule, stopped

    def decide(self, step: int, in_step: bool = True) -> Decision | None:
        """The decision of the previous round (or this ``every_steps`` step's save); starts this step's round
        unless the decision is to stop. ``in_step``: from ``step()``, where an elastic gang may change worlds
        (a framework's ``poll()`` does not)."""
        check_step(step)  # every step: it goes into the round
        elastic = self.elastic if in_step else None
        if elastic is not None:
            decision = elastic.collect(step)  # leaves for a new world here when one is due
            if elastic.changed or self._stopped():
                return None
        else:
            decision = self.agreement.collect()
        due = self._schedule.due(step)
        if decision is None and due == AT_STEP:
            decision = Decision(save=True, request=None, origin="self")  # every rank is at this step
        if decision is None or decision.request is None or not decision.request.stop:
            self.agreement.start(step, self._take_request(), decision is None and due == ON_CLOCK,
                                 world=elastic is not None and elastic.world_flag())
        return decision

    def needs_emergency_save(self, job, step: int) -> bool:
        """Decided on what every rank knows alike: whether this step's save committed locally."""
        return job is None or job.step != step or (job.local_done.wait() and job.local_manifest is None)

    def join_gang(self) -> int | None:
        """A process started to join a running elastic gang: enter it and take the state from a peer; the
        step (None when this process is not joining)."""
        if self.elastic is None or not elastic_gang.joining() or self.elastic.inbox.generation != 0:
            return None
        return self.elastic.join()

    def drain(self) -> None:
        """Finish the round in flight without acting on it (restore)."""
        self.agreement.drain()

    def close(self) -> None:
        if self.elastic is not None:
            self.elastic.drain()  # unless the group is broken
        else:
            self.agreement.drain()

    def release_groups(self, threads_ended: bool) -> None:
        """The last of close(): destroy the side groups now rather than at interpreter shutdown (group.py)."""
        self.agreement.release()
        self.ranks.release(threads_ended)

    def barrier(self) -> None:
        self.ranks.steps.barrier()
