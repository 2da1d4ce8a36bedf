"""A training step's phases timed (--time-steps, training/steptime.py): the timed steps'
phases add up to those steps, the timing changes nothing the run learns, and off it records
nothing. Toy target on CPU, fp32."""

from __future__ import annotations

import torch

from training.loop import TrainConfig, train
from training.steptime import PHASES, StepTimer

from block_fixtures import *  # noqa: F401,F403
from block_fixtures import TOY


def test_timed_steps_split_into_every_phase_and_learn_the_same_bits(toy, toy_trained):
    target, prompts, data = toy
    net, stats, losses = toy_trained   # the same run untimed (block_fixtures)
    assert "step_time" not in stats
    timed, tstats, tlosses = train(target, prompts,
                                   TrainConfig(seed=0, steps=40, time_steps=8, **TOY),
                                   progress=lambda m: None, data=data)
    assert tlosses == losses
    for (name, a), (_, b) in zip(net.state_dict().items(), timed.state_dict().items()):
        assert torch.equal(a, b), name
    st = tstats["step_time"]
    assert st["steps"] == 8 and set(st["phases_ms"]) == set(PHASES)
    assert all(v > 0 for v in st["phases_ms"].values()), st
    assert st["unsynchronised_step_ms"] > 0


def test_the_phases_add_up_to_the_timed_steps_wall_time():
    clock = StepTimer(torch.device("cpu"), steps=3, skip=1)
    for step in range(6):
        clock.start(step)
        for p in PHASES:
            sum(range(2000))   # some work in each phase
            clock.mark(p)
        clock.end()
    assert len(clock.timed) == 3 and [on for on, _ in clock.walls] == [False, True, True, True,
                                                                        False, False]
    for phases, (on, wall) in zip(clock.timed, clock.walls[1:4]):
        assert on and 0 < sum(phases.values()) <= wall
    s = clock.summary()
    assert s["steps"] == 3 and s["unsynchronised_step_ms"] is not None
    assert "features" in clock.line() and StepTimer(torch.device("cpu"), 0).summary() == {}
