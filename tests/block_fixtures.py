"""The toy target, its data and a toy-trained block drafter (CPU, fp32, one thread), shared
by the drafter's inference tests and its training tests."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch

from stock.drafters.block import BlockConfig, BlockNet
from training.cli import toy_setup
from training.data import generate_data
from training.loop import TrainConfig, train

__all__ = ["TOY", "one_thread", "_one_thread", "toy", "toy_trained", "random_net"]

TOY = dict(prompts=8, max_new=40, gen_batch=8, num_layers=1, num_target_layers=2, block_size=4,
           batch=8, anchors=8, warmup=3, lr=3e-3)


@contextmanager
def one_thread():
    """Tiny models run far faster on one thread of this shared 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module")
def toy():
    with one_thread():
        target, prompts = toy_setup(0, TOY["prompts"])
        data = generate_data(target, prompts, TOY["max_new"], 8, set(), progress=lambda m: None)
    return target, prompts, data


@pytest.fixture(scope="module")
def toy_trained(toy):
    target, prompts, data = toy
    with one_thread():
        net, stats, losses = train(target, prompts, TrainConfig(seed=0, steps=40, **TOY),
                                   progress=lambda m: None, data=data)
    return net, stats, losses


def random_net(target, block_size=4, seed=1, **kw) -> BlockNet:
    cfg = BlockConfig.for_target(target.cfg, num_layers=2, block_size=block_size, **kw)
    return BlockNet(cfg).init_weights(seed, std=0.2)
