"""How the Checkpointer works with the processes of a job: one process (single.py) or every rank of a
torch.distributed job together (collective.py), an elastic gang's rank included. The facade
(checkpointer.py) asks its mode for what differs: the ranks' collectives, how the state is captured and
staged, and how a step's decision is reached. A framework's own checkpoint folder (folder.py) is handed in
the same way in either mode.
"""

from __future__ import annotations

from pathlib import Path

from .. import elastic, world_sockets
from ..group import SIDE_GROUP_TIMEOUT, distributed, join
from .collective import Collective
from .single import SingleProcess


def choose(local_root: Path) -> SingleProcess | Collective:
    """Collective when torch.distributed is initialised (or this process joins an elastic gang), else a
    single process."""
    gang = elastic.enabled() and (distributed() or elastic.joining())
    if not gang:
        ranks = join(local_root, timeout=SIDE_GROUP_TIMEOUT)
        return SingleProcess() if ranks is None else Collective(ranks)
    with world_sockets.recording(0):  # a world formed after a loss cuts these groups off (world_sockets.py)
        # collectives that survive a lost peer, from the start (elastic.py)
        elastic.solo_group() if elastic.joining() else elastic.make_default_tolerant()
        ranks = join(local_root, timeout=elastic.tolerant_group.timeout())
    return SingleProcess() if ranks is None else Collective(ranks, gang=True)


__all__ = ["Collective", "SingleProcess", "choose"]
