"""The runner's checkpoints for Lightning (docs/integrations.md).

```python
from runner.integrations.lightning import RunnerCallback, last_checkpoint
trainer = lightning.Trainer(max_steps=1000, callbacks=[RunnerCallback()])
trainer.fit(model, datamodule=dm, ckpt_path=last_checkpoint())
```

After each optimizer step the callback asks the runner whether a checkpoint is due (the job's
``checkpoint.interval``) or a notice, SIGTERM or the resume drill came; if so it calls
``trainer.save_checkpoint`` (on every rank, as Lightning requires) into the runner's local folder and
commits that file on both tiers. On an emergency the training stops at that step and the process exits
(status 0) once ``fit()`` has wound down, to be resumed.

Lightning does not resume mid-epoch exactly by itself: it saves no RNG state, and a plain loader starts
its epoch over. The callback saves the RNG states (python, NumPy, torch) in its own state, and the
position of a ``runner.checkpoint.ResumableSampler`` (found on the training loader, or passed as
``sampler=``), which makes the resume exact on CPU.
"""

from __future__ import annotations

import warnings

import lightning
from lightning.pytorch import Callback

from runner.checkpoint import ResumableSampler, rng
from runner.checkpoint.folder_format import incoming_folder

from ._framework import FrameworkCheckpoints, live, log, require_version

__all__ = ["RunnerCallback", "last_checkpoint"]

SUPPORTED = (">=2.2", "<3")
require_version("lightning", lightning.__version__, "2.2", "3")

FRAMEWORK = "lightning"
FILE_NAME = "model.ckpt"  # the file trainer.save_checkpoint writes in each checkpoint folder
FALLBACK_DIR = "checkpoints"  # outside the runner, without local_dir=


def _loss_of(outputs):
    """The loss a training_step returned (a tensor, or a dict with "loss"), else None."""
    if isinstance(outputs, dict):
        return outputs.get("loss")
    return outputs if hasattr(outputs, "detach") else None


def _find_sampler(trainer) -> ResumableSampler | None:
    loader = getattr(trainer, "train_dataloader", None)
    batch_sampler = getattr(loader, "batch_sampler", None)
    for candidate in (getattr(loader, "sampler", None), getattr(batch_sampler, "sampler", None)):
        if isinstance(candidate, ResumableSampler):
            return candidate
    return None


# Lightning warns on a resume mid-epoch when the DataLoader itself has no state_dict, not knowing that this
# callback restores the position of the loader's ResumableSampler (state_dict below), which makes it exact.
NOT_RESUMABLE = r"You're resuming from a checkpoint that ended before the epoch ended and your dataloader is not resumable"


def _silence_the_not_resumable_warning() -> None:
    """Only that warning, and only where the loader's position is restored by a ResumableSampler."""
    from lightning.fabric.utilities.warnings import PossibleUserWarning

    warnings.filterwarnings("ignore", message=NOT_RESUMABLE, category=PossibleUserWarning)


def _rank_and_world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _every_rank(state: dict) -> list[dict]:
    """Every rank's ``state``, in rank order. Lightning keeps rank 0's checkpoint only, and calls the callbacks'
    state_dict on every rank inside ``save_checkpoint``, so each rank's RNG states are gathered into it."""
    import torch.distributed as dist

    rank, world = _rank_and_world()
    if world == 1:
        return [state]
    out = [None] * world
    dist.all_gather_object(out, state)
    return out


class RunnerCallback(Callback):
    """Periodic and emergency checkpoints of a ``lightning.Trainer`` through the runner.

    Options (all optional; under the runner they come from the job file): ``local_dir`` (outside the runner:
    ``./checkpoints``), ``durable_url``, ``interval`` (``"auto"`` or a duration), ``every_steps``, ``keep``,
    ``sampler`` (a ResumableSampler, when it is not the training loader's own); ``exit_on_stop=False``
    lets ``fit()`` return after an emergency checkpoint instead of exiting (then check ``should_stop``).
    """

    def __init__(self, *, local_dir=None, durable_url: str | None = None, interval=None, keep: int | None = None,
                 every_steps: int | None = None, sampler: ResumableSampler | None = None,
                 exit_on_stop: bool = True) -> None:
        self.checkpoints = FrameworkCheckpoints(FRAMEWORK, lightning.__version__, local_dir=local_dir,
                                                durable_url=durable_url, interval=interval, keep=keep,
                                                every_steps=every_steps)
        self.sampler = sampler
        self.exit_on_stop = exit_on_stop
        self._restored_state: dict | None = None
        self._last_step: int | None = None
        self._trainer = None

    @property
    def should_stop(self) -> bool:
        """True once an emergency checkpoint has committed and the Trainer was told to stop."""
        return self.checkpoints.should_stop

    # ------------------------------------------------------------------ Lightning hooks

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage != "fit":
            return
        self._trainer = trainer
        self.checkpoints.start(FALLBACK_DIR, pl_module)  # the process group exists by now
        self.checkpoints.check_found()  # last_checkpoint() ran before the model was known: check it before loading

    def on_train_start(self, trainer, pl_module) -> None:
        self.checkpoints.ckpt.reclaim_signals()  # Lightning's SIGTERM handler would stop without a checkpoint
        self.checkpoints.report_resumed(trainer.global_step)
        self._last_step = trainer.global_step
        sampler = self.sampler or _find_sampler(trainer)  # the loader exists now; its first batch is not drawn yet
        if sampler is not None:
            _silence_the_not_resumable_warning()
        state, self._restored_state = self._restored_state, None
        if state is None or state.get("sampler") is None:
            return
        if sampler is None:
            log.warning("the checkpoint holds a ResumableSampler's position, but the training loader has none; "
                        "the epoch starts over (pass sampler= to RunnerCallback)")
        else:
            sampler.load_state_dict(state["sampler"])

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step == self._last_step:  # gradient accumulation: no optimizer step in this batch
            return
        self._last_step = step
        self.checkpoints.trained(step, _loss_of(outputs))
        decision = self.checkpoints.due(step)
        if decision is None:
            return
        folder = self.checkpoints.incoming(step)
        trainer.save_checkpoint(incoming_folder(self.checkpoints.ckpt.local.root, step) / FILE_NAME)
        self.checkpoints.commit(step, folder, decision)
        if self.should_stop:
            trainer.should_stop = True

    def on_train_end(self, trainer, pl_module) -> None:
        self.checkpoints.report_resumed(trainer.global_step)
        self.checkpoints.close()
        if self.should_stop and self.exit_on_stop:
            self.checkpoints.exit_after_stop(trainer.global_step)

    def on_exception(self, trainer, pl_module, exception) -> None:
        if not isinstance(exception, SystemExit):
            self.checkpoints.close(error=True)

    def state_dict(self) -> dict:
        sampler = self.sampler or (_find_sampler(self._trainer) if self._trainer is not None else None)
        mine = {"rng": rng.portable(rng.capture()), "sampler": sampler.state_dict() if sampler is not None else None}
        return {"ranks": _every_rank(mine)}

    def load_state_dict(self, state_dict: dict) -> None:
        # The RNG states go back now, before Lightning creates the loader's iterator (which draws its base seed
        # from torch's generator, as the uninterrupted run's next epoch did); a sampler resumed mid-epoch
        # undoes that draw itself (sampler.py). The sampler's position waits for the loader (on_train_start).
        ranks = state_dict["ranks"]
        rank, world = _rank_and_world()
        if len(ranks) == world:
            mine = ranks[rank]
            rng.restore(rng.from_portable(mine["rng"]))
        else:  # the sampler re-shards what the job consumed; RNG states of other ranks do not apply
            mine = ranks[0]
            log.warning(f"the checkpoint was saved by {len(ranks)} ranks and this job has {world}; the RNG states "
                        f"are left as they are, so the resume is not bit-exact")
        self._restored_state = mine


def last_checkpoint() -> str | None:
    """A local path to the newest committed checkpoint file that verifies, for ``fit(ckpt_path=...)``.

    Fetched from the durable tier when this node lacks it; never newer than the step the runner handed over;
    None on a fresh start. Refuses (RestoreError) a checkpoint of another framework, and (when ``fit`` sets
    up) of another model."""
    checkpoints = live(FRAMEWORK) or FrameworkCheckpoints(FRAMEWORK, lightning.__version__)
    folder = checkpoints.last_checkpoint(FALLBACK_DIR)
    return str(folder / FILE_NAME) if folder is not None else None
