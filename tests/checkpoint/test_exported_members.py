"""The public API of runner.checkpoint is pinned here."""

import runner.checkpoint


def test_exported_members():
    """Only these names are public."""
    assert sorted(runner.checkpoint.__all__) == [
        "CheckpointConfigError", "CheckpointError", "Checkpointer", "CorruptCheckpointError",
        "RestoreError", "ResumableSampler",
    ]


def test_checkpointer_methods():
    """The Checkpointer offers the contract's methods and the should_stop flag."""
    for name in ("restore", "step", "save", "wait", "close", "should_stop"):
        assert hasattr(runner.checkpoint.Checkpointer, name)
