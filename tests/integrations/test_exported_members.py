"""The public API of runner.integrations (docs/integrations.md) is pinned: what a user imports stays importable."""

from __future__ import annotations

import importlib

import pytest


@pytest.mark.parametrize("framework, base", [("transformers", "transformers.TrainerCallback"),
                                             ("lightning", "lightning.pytorch.Callback")])
def test_each_integration_exports_a_callback_of_its_framework_and_last_checkpoint(framework, base):
    pytest.importorskip(framework)
    module = importlib.import_module(f"runner.integrations.{framework}")
    assert module.__all__ == ["RunnerCallback", "last_checkpoint"]
    package, _, name = base.rpartition(".")
    assert issubclass(module.RunnerCallback, getattr(importlib.import_module(package), name))
    assert callable(module.last_checkpoint)

