"""The restart timeline's geometry: bars on one time axis, lanes per node, notices, checkpoints, lost work."""

from __future__ import annotations

from runner.web import timeline

T0 = 1_790_000_000.0


def _row(attempt: int, started: float, ended: float | None, reason: str, **extra) -> dict:
    return {"attempt": attempt, "cloud": "local", "zone": f"local-{'abc'[attempt - 1]}", "instance_type": "sim-t4",
            "spot": True, "started": started, "ended": ended, "end_reason": reason, "checkpoint_step": None,
            "resumed_from_step": 0, "lost_seconds": None, "message": None, **extra}


def test_no_attempt_draws_nothing():
    """A job that has not started yet has no timeline."""
    assert timeline.layout([], {}, []) is None


def test_attempts_are_bars_in_time_order_with_lengths_in_proportion_to_their_durations():
    """Each attempt is a bar from its start to its end on one axis; the lost work ends the bar it was lost from."""
    rows = [_row(1, T0, T0 + 60, "preempted", lost_seconds=6.0), _row(2, T0 + 60, T0 + 240, "succeeded")]
    drawn = timeline.layout(rows, {}, [], now=T0 + 1000)
    first, second = drawn.lanes
    assert (first.label, first.reason) == ("#1 local-a · sim-t4", "preempted")
    assert (second.label, second.reason) == ("#2 local-b · sim-t4", "succeeded")
    assert first.x == timeline.GUTTER and second.x == first.x + first.width  # ends where the next starts
    assert abs(second.width / first.width - 3.0) < 0.01
    assert second.x + second.width == timeline.WIDTH - timeline.RIGHT  # the axis ends with the last attempt
    assert second.y > first.y
    # The lost work is the end of the first bar: 6 s of its 60 s.
    assert abs(first.lost_x + first.lost_width - (first.x + first.width)) < 0.2
    assert abs(first.lost_width / first.width - 0.1) < 0.01
    assert second.lost_x is None


def test_a_running_attempt_reaches_now():
    """The running attempt's bar ends at the present."""
    drawn = timeline.layout([_row(1, T0, None, "running")], {}, [], now=T0 + 30)
    (bar,) = drawn.lanes
    assert bar.reason == "running" and bar.x + bar.width == timeline.WIDTH - timeline.RIGHT
    assert "to now" in bar.title


def test_notices_and_checkpoints_are_marked_where_they_happened():
    """Notices and commits are marks on their own attempt's bar, at their times."""
    rows = [_row(1, T0, T0 + 100, "preempted", checkpoint_step=40), _row(2, T0 + 100, T0 + 200, "succeeded")]
    notices = {1: [{"time": T0 + 90, "title": "aws terminate notice", "node_rank": None}]}
    commits = [{"attempt": 1, "step": 20, "time": T0 + 50}, {"attempt": 1, "step": 40, "time": T0 + 95}]
    first, second = timeline.layout(rows, notices, commits, now=T0 + 200).lanes
    notice = [m for m in first.markers if m.kind == "notice"]
    saved = [m for m in first.markers if m.kind == "checkpoint"]
    assert [m.title for m in notice] == ["aws terminate notice"]
    assert [m.title for m in saved] == ["checkpoint of step 20 committed", "checkpoint of step 40 committed"]
    assert first.x < saved[0].x < saved[1].x < first.x + first.width
    assert saved[0].x < notice[0].x < saved[1].x  # 90 s: after step 20's commit, before step 40's
    assert second.markers == []


def test_a_multi_node_attempt_has_a_lane_per_node_coloured_by_that_nodes_end():
    """A gang's attempt has a lane per node rank; a notice marks the node that received it."""
    nodes = [{"rank": 0, "zone": "local-a", "instance_type": "sim-t4", "end_reason": "kept"},
             {"rank": 1, "zone": "local-a", "instance_type": "sim-t4", "end_reason": "preempted"}]
    rows = [_row(1, T0, T0 + 60, "preempted", nodes=nodes, lost_seconds=2.0),
            _row(2, T0 + 60, None, "running",
                 nodes=[{**n, "end_reason": "running"} for n in nodes])]
    notices = {1: [{"time": T0 + 55, "title": "gcp notice", "node_rank": 1}]}
    commits = [{"attempt": 1, "step": 10, "time": T0 + 30}]
    lanes = timeline.layout(rows, notices, commits, now=T0 + 120).lanes
    assert [(lane.attempt, lane.label, lane.reason) for lane in lanes] == [
        (1, "#1 node 0 · local-a · sim-t4", "kept"), (1, "#1 node 1 · local-a · sim-t4", "preempted"),
        (2, "#2 node 0 · local-a · sim-t4", "running"), (2, "#2 node 1 · local-a · sim-t4", "running")]
    node0, node1 = lanes[0], lanes[1]
    assert node0.lost_x is None and node1.lost_x is not None  # the kept node lost nothing; the preempted one did
    assert [m.kind for m in node0.markers] == ["checkpoint"]  # one checkpoint for the gang, on node 0's lane
    assert [m.kind for m in node1.markers] == ["notice"]      # the notice where it was received
    assert len({lane.y for lane in lanes}) == 4


def test_ticks_are_round_clock_times_inside_the_axis():
    """The axis is labelled with a few round clock times."""
    drawn = timeline.layout([_row(1, T0 + 5, T0 + 185, "succeeded")], {}, [], now=T0 + 185)
    labels = [t.label for t in drawn.ticks]
    assert 2 <= len(labels) <= timeline.MAX_TICKS
    assert all(label.endswith(":00") or label.endswith(":30") for label in labels)
    assert all(timeline.GUTTER <= t.x <= timeline.WIDTH - timeline.RIGHT for t in drawn.ticks)


def test_the_gap_spans_from_the_last_step_before_an_attempt_to_its_first_and_its_start_phases_follow_the_launch():
    """The next attempt's lane has a gap bracket from the previous attempt's last step to its first step, and
    segments for its node's boot (from the launch), setup (after it) and restore (ending when it was reported)."""
    rows = [_row(1, T0, T0 + 60, "preempted", last_step_at=T0 + 58.0, gap_seconds=None, first_step_at=T0 + 5),
            _row(2, T0 + 59, T0 + 160, "succeeded", first_step_at=T0 + 80.0, gap_seconds=22.0,
                 boot_seconds=10.0, setup_seconds=5.0, restore_seconds=2.0, restored_at=T0 + 78.0)]
    drawn = timeline.layout(rows, {}, [], now=T0 + 200)
    first, second = drawn.lanes
    scale = (timeline.WIDTH - timeline.GUTTER - timeline.RIGHT) / 160
    assert first.gap is None and first.phases == []  # nothing before the first attempt; its start unknown
    assert abs(second.gap.x - (timeline.GUTTER + 58 * scale)) < 0.2
    assert abs(second.gap.width - 22 * scale) < 0.2 and "gap 22.0 s" in second.gap.title
    boot, setup, restore = second.phases
    assert [p.kind for p in second.phases] == ["boot", "setup", "restore"]
    assert abs(boot.x - second.x) < 0.2 and abs(boot.width - 10 * scale) < 0.2
    assert abs(setup.x - (boot.x + boot.width)) < 0.2 and abs(setup.width - 5 * scale) < 0.2
    assert abs(restore.x - (timeline.GUTTER + 76 * scale)) < 0.2 and restore.title == "restore 2.0 s"


def test_a_gangs_phases_are_each_nodes_own_and_a_phase_of_no_time_is_not_drawn():
    """Each node lane shows its own boot; a node kept from the last attempt (0 s) has no boot segment."""
    nodes = [{"rank": 0, "zone": "local-a", "instance_type": "sim-t4", "end_reason": "running", "boot_seconds": 0.0,
              "setup_seconds": 0.0, "restore_seconds": None},
             {"rank": 1, "zone": "local-a", "instance_type": "sim-t4", "end_reason": "running", "boot_seconds": 30.0,
              "setup_seconds": 0.0, "restore_seconds": None}]
    lanes = timeline.layout([_row(1, T0, None, "running", nodes=nodes)], {}, [], now=T0 + 100).lanes
    assert lanes[0].phases == [] and [p.kind for p in lanes[1].phases] == ["boot"]


def test_an_elastic_gangs_lanes_show_who_was_in_and_the_narrower_stretch():
    """Node 1 left at 100 s; its replacement (rank 3) was launched then and joined after 10 s of boot and 20 s of
    setup: node 1's bar ends at 100 s, rank 3's starts there, and the survivors' lanes mark 100 to 130 s as the
    stretch with 2 of 3 nodes."""
    def iso(t):
        from runner.wire import iso as to_iso
        return to_iso(t)

    def node(rank, reason, **extra):
        return {"rank": rank, "node": f"n-{rank}", "zone": "local-a", "instance_type": "sim-t4", "end_reason": reason,
                **extra}
    nodes = [node(0, "running"), node(1, "lost", joined_at=None, left_at=iso(T0 + 100)), node(2, "running"),
             node(3, "running", joined_at=iso(T0 + 100), left_at=None, boot_seconds=10.0, setup_seconds=20.0)]
    row = _row(1, T0, None, "running", num_nodes=3, nodes=nodes)
    lanes = timeline.layout([row], {}, [], now=T0 + 200).lanes
    x_of = lambda t: timeline.GUTTER + t * (timeline.WIDTH - timeline.GUTTER - timeline.RIGHT) / 200
    assert abs(lanes[1].x + lanes[1].width - x_of(100)) < 0.2 and abs(lanes[3].x - x_of(100)) < 0.2
    for survivor in (lanes[0], lanes[2]):
        (narrow,) = [p for p in survivor.phases if p.kind == "narrow"]
        assert abs(narrow.x - x_of(100)) < 0.2 and abs(narrow.x + narrow.width - x_of(130)) < 0.2
        assert "2 of 3 nodes" in narrow.title
    assert not [p for p in lanes[1].phases + lanes[3].phases if p.kind == "narrow"]
