"""stock.linear: the CPU's W @ x^T path for 2..16 rows, F.linear elsewhere."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from stock.linear import SMALL_ROWS, Linear, linear, small_rows


def _data(rows: int, k: int = 48, n: int = 40, lead: tuple = ()):
    g = torch.Generator().manual_seed(rows)
    return torch.randn(*lead, rows, k, generator=g), torch.randn(n, k, generator=g)


@pytest.mark.parametrize("rows", [2, 5, 16])
def test_small_rows_take_w_xt_and_match_f_linear(rows):
    x, w = _data(rows)
    y = linear(x, w)
    assert y.shape == (rows, 40) and y.is_contiguous()
    assert torch.equal(y, torch.mm(w, x.t()).t())          # the path taken
    torch.testing.assert_close(y, F.linear(x, w), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 17, 64])
def test_other_row_counts_are_f_linear_bit_for_bit(rows):
    x, w = _data(rows)
    assert torch.equal(linear(x, w), F.linear(x, w))


def test_rows_count_leading_dims_and_bias():
    x, w = _data(3, lead=(2,))                                 # [2, 3, K]: 6 rows
    assert small_rows(x) and SMALL_ROWS[0] <= 6 <= SMALL_ROWS[1]
    b = torch.randn(40)
    y = linear(x, w, b)
    assert y.shape == (2, 3, 40)
    torch.testing.assert_close(y, F.linear(x, w, b), rtol=1e-5, atol=1e-5)
    assert not small_rows(torch.randn(1, 1, 48)) and not small_rows(torch.randn(17, 48))


def test_training_keeps_f_linear_and_gradients():
    lin = Linear(48, 40, bias=False)
    x = torch.randn(4, 48)
    y = lin(x)
    assert torch.equal(y, F.linear(x, lin.weight))            # grad-enabled weights: F.linear
    y.sum().backward()
    assert lin.weight.grad is not None and lin.weight.grad.shape == (40, 48)
    with torch.no_grad():
        assert torch.equal(lin(x), torch.mm(lin.weight, x.t()).t())


def test_linear_is_an_nn_linear_with_the_same_state_dict():
    lin = Linear(48, 40, bias=False)
    assert isinstance(lin, nn.Linear) and list(lin.state_dict()) == ["weight"]
    ref = nn.Linear(48, 40, bias=False)
    lin.load_state_dict(ref.state_dict())
    x = torch.randn(1, 48)
    with torch.no_grad():
        assert torch.equal(lin(x), ref(x))                    # one row: the same kernel
