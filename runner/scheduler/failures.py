"""Failures no relaunch can fix (told by the agent: a ``FailureKind``), and what the job is told.

Command not found (exit 127) and a module that cannot be imported fail the same way on every node: the job
ends FAILED on the first such exit instead of spending ``recovery.max_failures`` relaunches, and the attempt
loses no work (nothing trained). A CUDA out-of-memory error fails it too: the job file names its accelerator
(``resources.accelerators``), so a relaunch lands on the same one and runs out at the same point; moving it to
an accelerator with more memory is a change of that choice, which is the user's to make. A checkpoint that does
not fit the job's model (the library's RestoreError: the code changed a layer since the checkpoint was saved) would
be restored into the same model on every node.
"""

from __future__ import annotations

from ..protocol.events import FailureKind

_ADVICE = {
    FailureKind.COMMAND_NOT_FOUND: "not relaunched: no node would find it either; check `run` and `setup` (and that "
                               "the tool is installed by `setup`)",
    FailureKind.IMPORT_ERROR: "not relaunched: every node would fail the same import; install the package in "
                          "`setup` or the image",
    FailureKind.CUDA_OOM: "not relaunched: the same accelerator would run out again at the same point; use a smaller "
                      "batch or model, or an accelerator with more memory in resources.accelerators",
    FailureKind.CHECKPOINT_MISMATCH: "not relaunched: every node would restore the same checkpoint into the same "
                                     "model; resume with the code that saved it, or point checkpoint.local_dir and "
                                     "checkpoint.durable_url elsewhere to start fresh",
}


def is_permanent(kind: str | None) -> bool:
    return kind in FailureKind.values()


def trained_nothing(kind: str) -> bool:
    """Whether a failure of this kind comes before any training (so the attempt lost no work)."""
    return kind in (FailureKind.COMMAND_NOT_FOUND, FailureKind.IMPORT_ERROR)


def failure_message(kind: str, what: str | None, peak_memory_gb: float | None = None) -> str:
    """The restart log's and the job's one line: what failed (the agent's words), what the job measured, why
    it is not relaunched."""
    what = what or {FailureKind.COMMAND_NOT_FOUND: "command not found (exit 127)",
                    FailureKind.IMPORT_ERROR: "a module could not be imported",
                    FailureKind.CUDA_OOM: "CUDA out of memory",
                    FailureKind.CHECKPOINT_MISMATCH: "the checkpoint does not fit the job's model"}[kind]
    if kind == FailureKind.CUDA_OOM and peak_memory_gb is not None:
        what += f"; peak accelerator memory reported by the job: {peak_memory_gb:.2f} GB"
    return f"{what}; {_ADVICE[kind]}"
