"""Progress lines with the time left (specpilot/judges/eta.py)."""

from __future__ import annotations

from specpilot.judges.eta import Clock, Eta, span


def test_the_time_left_is_the_recent_units_mean_times_the_units_left():
    now, lines = [0.0], []
    eta = Eta("round", 4, lines.append, clock=lambda: now[0])
    assert lines == ["round 1/4"]               # no estimate before a unit has ended
    for t in (10.0, 30.0, 60.0, 100.0):         # units of 10, 20, 30, 40 s
        now[0] = t
        eta.done()
    assert lines[1:] == ["round 2/4 (about 30 s left)",     # 10 s x 3
                         "round 3/4 (about 30 s left)",     # 15 s x 2
                         "round 4/4 (about 20 s left)"]     # 20 s x 1
    assert eta.count == 4 and len(lines) == 4   # the last unit ends without a line
    assert Eta("nothing", 0, lines.append).total == 0 and len(lines) == 4


def test_a_first_unit_with_a_start_up_is_reported_not_extrapolated():
    """The verdicts' references said "request 2/256 (about 2.7 h left)" after a first
    request of 38 s (the worker's first captures) and 0.3 s for each one after it."""
    now, lines = [0.0], []
    eta = Eta("request", 256, lines.append, clock=lambda: now[0], startup=True)
    for t in (38.0, 38.3, 38.6):
        now[0] = t
        eta.done()
    assert lines[1:] == ["request 2/256 (the first took 38 s)",
                         "request 3/256 (about 76 s left)", "request 4/256 (about 76 s left)"]


def test_spans_read_as_people_say_them():
    assert [span(s) for s in (8, 89.6, 210, 5399, 7200)] == ["8 s", "90 s", "3.5 min",
                                                              "90.0 min", "2.0 h"]


def test_the_clock_keeps_each_phase_its_own_wall_time_overlaps_included():
    now = [0.0]
    clock = Clock(lambda: now[0])
    with clock.phase("reference"):
        now[0] = 100.0
        with clock.phase("graphs (beside the reference)"):   # overlapping: its own time
            now[0] = 130.0
        now[0] = 138.0
    with clock.phase("rounds"):
        now[0] = 176.0
    with clock.phase("rounds"):                              # a second session adds up
        now[0] = 180.0
    assert clock.seconds == {"reference": 138.0, "graphs (beside the reference)": 30.0,
                             "rounds": 42.0}
    assert clock.line() == ("the run's clock: reference 2.3 min, graphs (beside the reference) "
                            "30 s, rounds 42 s; 3.0 min in all")
