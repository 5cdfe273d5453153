"""One process: no collectives; a request or a due save is acted on at the step it is seen."""

from __future__ import annotations

from .. import rng
from ..agreement import Decision
from ..group import Solo
from ..persist import Persister
from ..schedule import SaveSchedule
from ..staging import Stager


class SingleProcess:
    """The mode of a process that is not under torch.distributed."""

    ranks = None
    rank = 0
    world_size = 1
    folder_leader = True
    writer = None
    gang = False  # never an elastic gang's rank: those are collective
    quiet_steps = True  # a step with nothing pending and no save due needs no decide() (no round to start)
    world_changed = False
    on_world = None

    def __init__(self) -> None:
        self.hello: dict = {}  # the control channel's hello names no rank
        self.comm = Solo()
        self.stager = Stager()

    def check_same_setup(self, signature: dict) -> None:
        pass

    def make_persister(self, *args, **kwargs) -> Persister:
        return Persister(*args, **kwargs)

    def capture(self, step: int, objects: dict, extra: dict) -> dict:
        return {
            "step": step,
            "objects": {name: obj.state_dict() for name, obj in objects.items()},
            "extra": dict(extra),
            "rng": rng.capture(),
        }

    @staticmethod
    def replicated(state: dict) -> bool:
        return True  # one process: its restore reads the whole checkpoint

    def bind(self, take_request, schedule: SaveSchedule, stopped) -> None:
        """Where ``decide`` takes the pending request (a callable) and asks whether a save is due."""
        self._take_request, self._schedule = take_request, schedule

    def decide(self, step: int, in_step: bool = True) -> Decision | None:
        """A pending request, else a periodic save when one is due, else None."""
        request = self._take_request()
        if request is None and self._schedule.due(step) is None:
            return None
        return Decision(save=True, request=request, origin="self")

    def needs_emergency_save(self, job, step: int) -> bool:
        """The emergency needs a save of its own unless this step's last save is good."""
        return job is None or job.step != step or job.error is not None

    def join_gang(self) -> int | None:
        return None  # not an elastic gang's process

    def drain(self) -> None:
        pass

    def close(self) -> None:
        pass

    def release_groups(self, threads_ended: bool) -> None:
        pass

    def barrier(self) -> None:
        pass
