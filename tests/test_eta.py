"""Progress lines with the time left (specpilot/judges/eta.py)."""

from __future__ import annotations

from specpilot.judges.eta import Eta, span


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


def test_spans_read_as_people_say_them():
    assert [span(s) for s in (8, 89.6, 210, 5399, 7200)] == ["8 s", "90 s", "3.5 min",
                                                              "90.0 min", "2.0 h"]
