"""The DDTree step's host lengths (sglang_ddtree/lens.py) on the CPU: which source a step gets, the bounds each
forward's KV plan takes, and the flat verify mask's size against the layout the backends read."""

from __future__ import annotations

import pytest
import torch
from sglang_ddtree import lens as L

WINDOW = 17  # budget 16: verify width 17 > block 8


def _dev(*v: int) -> torch.Tensor:
    return torch.tensor(v, dtype=torch.int64)


def test_the_schedulers_host_copy_is_used_as_is():
    got = L.host_lens(seq_lens_cpu=_dev(40, 7), reserved=_dev(80, 48), device_lens=_dev(40, 7), window=WINDOW)
    assert got.source == "exact" and got.exact
    assert got.bound(8).tolist() == [48, 15] and got.bound(WINDOW).tolist() == [57, 24]


def test_without_a_host_copy_the_reservation_bounds_every_forward_without_a_copy_from_the_device():
    class Exploding(torch.Tensor):  # a device tensor whose host copy would be the wait being cut
        def to(self, *a, **k):
            if "cpu" in [str(x) for x in a] + [str(v) for v in k.values()]:
                raise AssertionError("the step copied the device lengths to the host")
            return super().to(*a, **k)

    dev = _dev(40, 7).as_subclass(Exploding)
    reserved = _dev(80, 48)
    got = L.host_lens(seq_lens_cpu=None, reserved=reserved, device_lens=dev, window=WINDOW)
    assert got.source == "reserved" and not got.exact
    assert got.bound(8).tolist() == [80, 48] == got.bound(WINDOW).tolist()
    reserved[0] = 1  # the scheduler refills its buffer for the next step: this step's bound keeps its values
    assert got.bound(8).tolist() == [80, 48]


@pytest.mark.parametrize("kw", [dict(need_exact=True), dict(sync=True), dict(reserved=None),
                                dict(reserved=_dev(80))])  # the numpy path, measured wait, none, a stale size
def test_the_device_lengths_are_copied_only_where_nothing_else_serves(kw):
    args = dict(seq_lens_cpu=None, reserved=_dev(80, 48), device_lens=_dev(40, 7), window=WINDOW) | kw
    got = L.host_lens(**args)
    assert got.source == "synced" and got.prefix.tolist() == [40, 7]


def test_the_host_path_gets_exact_lengths_even_with_a_scheduler_copy():
    got = L.host_lens(seq_lens_cpu=_dev(41, 8), reserved=None, device_lens=_dev(40, 7), window=WINDOW,
                      need_exact=True)
    assert got.source == "synced" and got.prefix.tolist() == [40, 7]


@pytest.mark.parametrize("width", [0, WINDOW + 1])
def test_a_forward_wider_than_the_window_is_refused(width):
    got = L.host_lens(seq_lens_cpu=None, reserved=_dev(80), device_lens=_dev(40), window=WINDOW)
    with pytest.raises(ValueError, match=r"1\.\.17"):
        got.bound(width)


def _layout_cells(prefix: list[int], w: int) -> int:
    """What the target-verify backends read: ``w x (prefix + w)`` per request (triton's mask_indptr)."""
    return sum(w * (p + w) for p in prefix)


@pytest.mark.parametrize("prefix,reserved", [([40, 7], [80, 48]), ([1], [26]), ([300, 0, 12], [330, 26, 40])])
def test_the_mask_covers_the_layout_from_either_source(prefix, reserved):
    w = WINDOW
    exact = L.host_lens(seq_lens_cpu=_dev(*prefix), reserved=None, device_lens=_dev(*prefix), window=w)
    bound = L.host_lens(seq_lens_cpu=None, reserved=_dev(*reserved), device_lens=_dev(*prefix), window=w)
    assert L.mask_cells(exact, w) == w * sum(p + w for p in prefix) + len(prefix) * w * w  # the formula before
    for lens in (exact, bound):
        assert L.mask_cells(lens, w) >= _layout_cells(prefix, w)


def test_the_mask_is_capped_at_the_captured_buffer_which_always_holds_the_layout():
    w, max_ctx, max_bs = WINDOW, 64, 2
    buffer = max_bs * w * (max_ctx + w)  # sglang's FULL_MASK verify buffer
    prefix, reserved = [64, 60], [96, 96]  # near the context's end the reservation runs past it
    bound = L.host_lens(seq_lens_cpu=None, reserved=_dev(*reserved), device_lens=_dev(*prefix), window=w)
    assert L.mask_cells(bound, w) > buffer
    assert _layout_cells(prefix, w) <= L.mask_cells(bound, w, limit=buffer) == buffer


def test_the_switch_reads_one():
    assert L.sync_forced({L.SYNC_ENV: "1"}) and not L.sync_forced({L.SYNC_ENV: "0"}) and not L.sync_forced({})
