"""The runner's checkpoints for the Hugging Face Trainer (docs/integrations.md).

```python
from runner.integrations.transformers import RunnerCallback, last_checkpoint
trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[RunnerCallback()])
trainer.train(resume_from_checkpoint=last_checkpoint())    # None on a fresh start
```

After each optimizer step the callback asks the runner whether a checkpoint is due (the job's
``checkpoint.interval``) or a notice, SIGTERM or the resume drill came; if so it sets ``should_save`` and the
Trainer writes its own ``checkpoint-N`` folder (model, optimizer, scheduler, RNG states, trainer state),
which ``on_save`` commits on both tiers. On an emergency the Trainer then stops at that step, and the
process exits (status 0) once ``train()`` has wound down, to be resumed.
"""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import transformers
from transformers import TrainerCallback

from ._framework import FrameworkCheckpoints, live, log, require_version

__all__ = ["RunnerCallback", "last_checkpoint"]

SUPPORTED = (">=4.40", "<6")
require_version("transformers", transformers.__version__, "4.40", "6")

FRAMEWORK = "transformers"
PREFIX = "checkpoint"  # the Trainer's checkpoint folders: <output_dir>/checkpoint-<global_step>


def _loss_of(output):
    """The loss a Hugging Face model returned (``ModelOutput.loss`` or ``{"loss": ...}``), else None."""
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, dict):
        loss = output.get("loss")
    return loss


class RunnerCallback(TrainerCallback):
    """Periodic and emergency checkpoints of a ``transformers.Trainer`` through the runner.

    Options (all optional; under the runner they come from the job file): ``local_dir`` (outside the
    runner: the Trainer's ``output_dir``), ``durable_url``, ``interval`` (``"auto"`` or a duration),
    ``every_steps``, ``keep``; ``exit_on_stop=False`` lets ``train()`` return after an emergency checkpoint
    instead of exiting (then check ``callback.should_stop``).
    """

    def __init__(self, *, local_dir=None, durable_url: str | None = None, interval=None, keep: int | None = None,
                 every_steps: int | None = None, exit_on_stop: bool = True) -> None:
        self.checkpoints = FrameworkCheckpoints(FRAMEWORK, transformers.__version__, local_dir=local_dir,
                                                durable_url=durable_url, interval=interval, keep=keep,
                                                every_steps=every_steps)
        self.exit_on_stop = exit_on_stop
        self._pending = None  # the decision of on_step_end, carried out in on_save
        self._loss = None  # this step's loss, summed over micro-batches, as returned by the model
        self._hook = None

    @property
    def should_stop(self) -> bool:
        """True once an emergency checkpoint has committed and the Trainer was told to stop."""
        return self.checkpoints.should_stop

    # ------------------------------------------------------------------ Trainer events

    def on_init_end(self, args, state, control, model=None, **kwargs):
        _explain_tied_weights(model)
        self.checkpoints.start(args.output_dir, model)
        self.checkpoints.check_found()  # when last_checkpoint() ran before the Trainer was built

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.checkpoints.start(args.output_dir, model)  # when added after the Trainer was built
        if model is not None and self._hook is None:
            self._hook = model.register_forward_hook(self._record_loss)

    def on_step_begin(self, args, state, control, **kwargs):
        self.checkpoints.report_resumed(state.global_step)

    def on_step_end(self, args, state, control, **kwargs):
        loss, self._loss = self._loss, None
        self.checkpoints.trained(state.global_step, loss)
        decision = self.checkpoints.due(state.global_step)
        if decision is not None:
            self._pending = decision
            control.should_save = True

    def on_save(self, args, state, control, **kwargs):
        if self.should_stop:  # the Trainer winding down saves again at the stop step; that one is committed
            return
        from runner.checkpoint.agreement import Decision

        decision, self._pending = self._pending or Decision(save=True, request=None, origin="self"), None
        step = state.global_step
        source = Path(args.output_dir) / f"{PREFIX}-{step}"
        if not source.is_dir():
            log.error(f"the Trainer saved step {step}, but {source} is not there; this checkpoint is not committed")
            return
        # Checkpoints the Trainer takes only because the callback asked are moved into the runner's folder;
        # those of the Trainer's own save_strategy are linked, so its rotation and best-model logic still work.
        move = str(getattr(args.save_strategy, "value", args.save_strategy)) == "no"
        folder = self.checkpoints.take_in(step, source, move)
        self.checkpoints.commit(step, folder, decision)
        if self.should_stop:
            control.should_training_stop = True

    def on_train_end(self, args, state, control, **kwargs):
        self.checkpoints.report_resumed(state.global_step)
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        self.checkpoints.close()
        if self.should_stop and self.exit_on_stop:
            self.checkpoints.exit_after_stop(state.global_step)

    # ------------------------------------------------------------------ helpers

    def _record_loss(self, module, args, output) -> None:  # noqa: ARG002 - a forward hook's signature
        if not module.training:
            return
        loss = _loss_of(output)
        if loss is not None:
            loss = loss.detach()
            self._loss = loss if self._loss is None else self._loss + loss


MISSING_KEYS = "There were missing keys in the checkpoint model loaded: "


class _TiedWeights(logging.Filter):
    """Drops the Trainer's "missing keys" warning on a resume when every key it names is a weight tied to one
    that was loaded (GPT-2's ``lm_head.weight`` is ``transformer.wte.weight``: saved once, restored with it),
    saying so in one line instead. Any other missing key is still warned about."""

    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.startswith(MISSING_KEYS):
            return True
        try:
            missing = ast.literal_eval(message[len(MISSING_KEYS):].rstrip("."))
        except (ValueError, SyntaxError):
            return True
        tied = {key: self._tied_to(key) for key in missing} if isinstance(missing, list) and missing else {}
        if not tied or None in tied.values():
            return True
        log.info("restored tied weights with the weights they share: "
                 + ", ".join(f"{key} is {source}" for key, source in tied.items()))
        return False

    def _tied_to(self, key: str) -> str | None:
        """The loaded parameter that ``key`` is (the same tensor), or None."""
        try:
            parameter = self.model.get_parameter(key)
        except (AttributeError, TypeError):
            return None
        for name, other in self.model.named_parameters():  # each shared tensor once, under its first name
            if other is parameter and name != key:
                return name
        return None


def _explain_tied_weights(model) -> None:
    trainer_log = logging.getLogger("transformers.trainer")
    for old in [f for f in trainer_log.filters if isinstance(f, _TiedWeights)]:
        trainer_log.removeFilter(old)
    if model is not None:
        trainer_log.addFilter(_TiedWeights(model))


def last_checkpoint() -> str | None:
    """A local path to the newest committed checkpoint that verifies, for ``train(resume_from_checkpoint=...)``.

    Fetched from the durable tier when this node lacks it; never newer than the step the runner handed over;
    None on a fresh start. Refuses (RestoreError) a checkpoint of another framework or another model."""
    checkpoints = live(FRAMEWORK) or FrameworkCheckpoints(FRAMEWORK, transformers.__version__)
    folder = checkpoints.last_checkpoint("checkpoints")  # a callback the Trainer has set up knows its folder
    return str(folder) if folder is not None else None
