"""What both framework callbacks share: a Checkpointer whose payload is the framework's own checkpoint folder.

``FrameworkCheckpoints`` is the runner's half of a callback. The callback asks ``due(step)`` after each
optimizer step; when a save is due (or a notice, SIGTERM or the drill came) the framework writes its
checkpoint, and ``commit`` hands that folder to ``runner.checkpoint`` (folder_format.py), which commits it
on both tiers, keeps ``keep``, and on an emergency waits for the durable tier and sets ``should_stop``.
``last_checkpoint`` finds the newest committed folder that verifies and was written by the same framework
for the same model.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from pathlib import Path

from runner.checkpoint import Checkpointer
from runner.checkpoint.agreement import Decision
from runner.checkpoint.errors import RestoreError
from runner.checkpoint.folder_format import take_in
from runner.checkpoint.group import leave_process_group
from runner.checkpoint.log import get_logger
from runner.checkpoint.manifest import FOLDER
from runner.checkpoint.durable import DurableTier
from runner.checkpoint.group import Solo
from runner.checkpoint.local import LocalTier
from runner.checkpoint.restore import Restored, restore_into, written_by
from runner.protocol import environment as env

log = get_logger("runner.integrations")

RESTORE_LOCK = ".restore.lock"  # in the local folder: one process of a node at a time fetches and verifies
_WRAPPER_PREFIXES = ("module.", "_orig_mod.", "_forward_module.")
_live: dict[str, "FrameworkCheckpoints"] = {}  # the newest callback of each framework, for last_checkpoint()


def require_version(package: str, found: str, minimum: str, below: str) -> None:
    """Raise ImportError naming the supported versions when ``found`` is not in [minimum, below)."""
    from packaging.version import InvalidVersion, Version

    try:
        ok = Version(minimum) <= Version(found) < Version(below)
    except InvalidVersion:
        ok = False
    if not ok:
        raise ImportError(f"runner.integrations.{package} supports {package} >={minimum},<{below}; {found} is "
                          f"installed. Install a supported version: pip install '{package}>={minimum},<{below}'")


def model_signature(module) -> dict:
    """The model's class and a digest of its parameter names and shapes (not values, not dtypes)."""
    digest = hashlib.sha256()
    for name, tensor in module.state_dict().items():
        for prefix in _WRAPPER_PREFIXES:
            name = name.removeprefix(prefix)
        digest.update(f"{name}:{tuple(getattr(tensor, 'shape', ()))}\n".encode())
    return {"model": type(module).__name__, "signature": digest.hexdigest()[:16]}


def under_runner() -> bool:
    return bool(os.environ.get(env.CHECKPOINT_DIR) or os.environ.get(env.CONTROL))


class FrameworkCheckpoints:
    """The Checkpointer of one framework callback, built when the framework's setup is known."""

    def __init__(self, framework: str, version: str, *, local_dir=None, durable_url=None, interval=None,
                 keep=None, every_steps=None) -> None:
        self.framework, self.version = framework, version
        self.options = {"durable_url": durable_url, "interval": interval, "keep": keep, "every_steps": every_steps}
        self.local_dir = local_dir
        self.ckpt: Checkpointer | None = None
        self.model: dict | None = None
        self.found: Restored | None = None  # what last_checkpoint() returned
        self.found_root: Path | None = None  # the local folder it is in
        self.reported = False
        self.stop_reason: str | None = None
        self._told_copy = False
        _live[framework] = self

    @property
    def should_stop(self) -> bool:
        return self.ckpt is not None and self.ckpt.should_stop

    def folder(self, fallback_dir) -> str:
        return str(self.local_dir or os.environ.get(env.CHECKPOINT_DIR) or fallback_dir)

    def start(self, fallback_dir, model=None) -> Checkpointer:
        """Build the Checkpointer (once; collective under torch.distributed); remember the model's signature."""
        if model is not None:
            self.model = model_signature(model)
        if self.ckpt is None:
            self.ckpt = Checkpointer(local_dir=self.folder(fallback_dir), **self.options)
            if not under_runner():
                every = (f"every {self.options['every_steps']} steps" if self.options["every_steps"] else
                         f"interval {self.options['interval'] or 'auto'}")
                log.info(f"{self.framework} RunnerCallback: not under the runner (no RUNNER_CHECKPOINT_DIR); "
                         f"periodic checkpoints ({every}) into {self.ckpt.local.root}, SIGTERM takes one and stops")
        return self.ckpt

    def payload(self) -> dict:
        return {"framework": self.framework, "version": self.version, **(self.model or {})}

    def check(self, folder: Path, manifest, where: str) -> None:  # noqa: ARG002 - restore_into's interface
        """Refuse a checkpoint this framework and model cannot resume from, naming both."""
        payload = manifest.payload or {}
        if manifest.layout != FOLDER or payload.get("framework") != self.framework:
            raise RestoreError(f"{where} was written by {written_by(manifest)}, not by the {self.framework} "
                               f"integration; resume it with what wrote it, or point the checkpoint folder "
                               f"(checkpoint.local_dir/durable_url, or local_dir=) elsewhere to start fresh")
        if self.model and payload.get("signature") and payload["signature"] != self.model["signature"]:
            raise RestoreError(f"{where} holds a {payload.get('model')} (parameters {payload['signature']}); this "
                               f"run trains a {self.model['model']} (parameters {self.model['signature']}). Resume "
                               f"with the same model, or point the checkpoint folder elsewhere to start fresh")

    def last_checkpoint(self, fallback_dir) -> Path | None:
        """The local folder of the newest committed checkpoint that verifies; None when there is none.

        With the framework set up (the Checkpointer built) every rank looks together; before that (no
        process group yet) each process looks on its own (``find``) and the model is checked at setup."""
        if self.ckpt is None:
            found = self.find(fallback_dir)
            return LocalTier(self.folder(fallback_dir)).folder(found.step) if found is not None else None
        self.found = self.ckpt.restore_folder(self.check)
        self.found_root = self.ckpt.local.root
        return self.ckpt.local.folder(self.found.step) if self.found is not None else None

    def check_found(self) -> None:
        """Check what ``last_checkpoint`` returned against the model, now known, before the framework loads it."""
        if self.found is None or self.model is None or self.found_root is None:
            return
        tier = LocalTier(self.found_root)
        folder = tier.folder(self.found.step)
        self.check(folder, tier.read_manifest(folder), str(folder))

    def find(self, fallback_dir) -> Restored | None:
        """``last_checkpoint`` before the framework has set up (no Checkpointer yet, and no process group):
        this process looks at both tiers and fetches what its local folder lacks. Processes sharing the
        local folder (the ranks of one node) take turns, so one downloads and the others verify its copy."""
        local = LocalTier(self.folder(fallback_dir))
        url = self.options["durable_url"] or os.environ.get(env.CHECKPOINT_URL)
        durable = DurableTier(url) if url else None
        resume_step = os.environ.get(env.RESUME_STEP)
        local.root.mkdir(parents=True, exist_ok=True)
        with open(local.root / RESTORE_LOCK, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self.found = restore_into(local, durable, Solo(), True, {}, {}, None, apply_folder=self.check,
                                      max_step=int(resume_step) if resume_step and resume_step.isdigit() else None)
        self.found_root = local.root
        return self.found

    def report_resumed(self, step: int) -> None:
        """Tell the agent, once, the step the framework resumed from (0: a fresh start)."""
        if self.reported or self.ckpt is None:
            return
        self.reported = True
        self.ckpt.telemetry.send_manifest_when_ready()  # what this attempt runs with, once (docs/restart-log.md)
        found = self.found if self.found is not None and self.found.step == step else None
        if step and found is None:
            log.warning(f"{self.framework} resumed at step {step} from a checkpoint that last_checkpoint() did not "
                        f"return; the runner reports step {step} without a manifest")
            found = Restored(step, None, 1)
        self.ckpt.report_restored(found)

    def trained(self, step: int, loss=None) -> None:
        """One optimizer step done (with its loss when known): the job's steps/s and NaN steps (telemetry.py)."""
        if self.ckpt is not None:
            self.ckpt.telemetry.on_step(step, loss)

    def due(self, step: int) -> Decision | None:
        return self.ckpt.poll(step) if self.ckpt is not None else None

    def incoming(self, step: int) -> Path | None:
        return self.ckpt.incoming(step)

    def commit(self, step: int, folder: Path | None, decision: Decision) -> None:
        """Commit the files in ``folder`` (from ``incoming``) as the checkpoint of ``step``."""
        self.ckpt.commit_folder(step, folder, decision, self.payload())
        if self.ckpt.should_stop:
            self.stop_reason = decision.request.reason

    def say_stopping(self, step: int) -> None:
        why = {"drill": "the resume drill", "cancel": "a cancellation", "move": "a move to spot"}.get(self.stop_reason,
                                                                                                     "a preemption")
        log.info(f"stopping at step {step} for {why}; the checkpoint is committed")

    def exit_after_stop(self, step: int) -> None:
        """The emergency checkpoint is committed and the framework has wound down: leave, to be resumed."""
        self.say_stopping(step)
        leave_process_group()
        raise SystemExit(0)

    def take_in(self, step: int, source: Path, move: bool) -> Path | None:
        """Move (or link) the framework's folder ``source`` into ``incoming(step)``; returns that folder."""
        target = self.incoming(step)
        if target is not None and take_in(source, target, move) and not self._told_copy:
            self._told_copy = True
            log.info(f"{source} is on another filesystem than {self.ckpt.local.root}: each checkpoint is copied "
                     f"before training goes on; put the output folder on the checkpoint disk to avoid the copy")
        return target

    def close(self, error: bool = False) -> None:
        if self.ckpt is not None:
            self.ckpt.close(_error=error)


def live(framework: str) -> FrameworkCheckpoints | None:
    return _live.get(framework)
