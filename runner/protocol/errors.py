"""The root of every error runner raises, and its branches: defined here, at the bottom of the project, so that the
protocol's own errors (a control message that cannot be read) derive from it too. ``runner.errors`` is where the
rest of the project imports them from (its docstring says which branch is for what).
"""

from __future__ import annotations


class RunnerError(Exception):
    """Anything runner raises on purpose."""


class InputError(RunnerError):
    """Bad input, named with the key or value at fault and the fix."""


class ConfigError(InputError):
    """A configuration that cannot be used; the message names the file and the key."""


class CloudError(RunnerError):
    """A provider or its cloud refused or failed."""


class Unreachable(RunnerError):
    """A service we need (the controller, the database) did not answer."""
