"""Uniform Progress, the policy of *Can't Be Late* (Wu et al., NSDI'24), as published: one zone.

Its four rules, with ep(t) = total work x t / deadline the expected progress of a uniform pace,
cp(t) the progress made, C(t) the work left, R(t) the time left and d the changeover delay (a restart):

1. Uniform progress: when the job is idle and cp(t) < ep(t), switch to on-demand to catch up.
2. Taking risks: switch to spot whenever it is available, even when behind; stay on spot until it is
   preempted.
3. Hysteresis: on on-demand, stay until cp(t) >= ep(t + 2d).
4. Safety net: when the job is idle and R(t) < C(t) + 2d, switch to on-demand and stay there to the end.

Kept apart from :mod:`runner.costpolicy.decide` (runner's own policy) because it is only a baseline of
the simulator; the changeover delay is charged by the simulator the same way for every policy.
"""

from __future__ import annotations

from dataclasses import dataclass

SPOT, ON_DEMAND, IDLE = "spot", "on-demand", "idle"


@dataclass
class UniformProgress:
    """The rules' state for one run: the total work, the deadline and d, in seconds from the start."""

    total_work: float
    deadline: float
    changeover: float
    on_demand_to_the_end: bool = False

    def expected_progress(self, elapsed: float) -> float:
        return self.total_work * min(1.0, elapsed / self.deadline)

    def step(self, *, elapsed: float, done: float, current: str, spot_available: bool) -> str:
        """SPOT, ON_DEMAND or IDLE for the next tick; ``current`` is IDLE after a preemption."""
        if self.on_demand_to_the_end:
            return ON_DEMAND
        work_left, time_left = self.total_work - done, self.deadline - elapsed
        if current == IDLE and time_left < work_left + 2 * self.changeover:  # rule 4
            self.on_demand_to_the_end = True
            return ON_DEMAND
        if current == ON_DEMAND and done < self.expected_progress(elapsed + 2 * self.changeover):  # rule 3
            return ON_DEMAND
        if spot_available:  # rule 2 (on spot already: it stays until preempted)
            return SPOT
        if done < self.expected_progress(elapsed):  # rule 1
            return ON_DEMAND
        return IDLE
