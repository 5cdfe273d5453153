"""Fixtures of the integration tests: no runner variables unless a test sets them; frameworks offline."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def _outside_the_runner(monkeypatch):
    for name in [n for n in os.environ if n.startswith("RUNNER_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def clean_env(**extra: str) -> dict:
    """The environment of a trainee subprocess: this one without RUNNER_* variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNNER_")}
    env.update({"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "PYTHONHASHSEED": "0",
                "TOKENIZERS_PARALLELISM": "false"})
    env.update(extra)
    return env


def load_example(framework: str):
    """examples/<framework>/train.py as a module of its own name (both examples are called train.py)."""
    import importlib.util

    name = f"example_{framework}_train"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "examples" / framework / "train.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]
