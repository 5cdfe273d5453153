"""Deadline-aware cost policy: the decision (shared by the scheduler and the simulator), traces, the simulator."""

from .decide import Decision, Market, decide, return_to_spot
from .traces import TraceError, Traces, load_traces

__all__ = ["Decision", "Market", "TraceError", "Traces", "decide", "load_traces", "return_to_spot"]
