"""The staging buffer's layout: bundles of named arrays packed into one buffer come back as the same
NamedTuples, each field a view of its own array's bytes. Checked on CPU buffers: the pinned and
device buffers of `Staging` are laid out by these same functions."""

from typing import NamedTuple

import numpy as np
import torch

from gpu.staging import aligned_offsets, host_views_by_dtype, on_cpu, same_place, views_of


class Pair(NamedTuple):
    ids: np.ndarray
    weights: np.ndarray


class Single(NamedTuple):
    values: np.ndarray


def packed(bundles) -> tuple[torch.Tensor, list[int]]:
    """A byte buffer holding the bundles' arrays as `Staging.upload` lays them out."""
    arrays = [a for bundle in bundles if bundle is not None for a in bundle]
    offsets, total = aligned_offsets(arrays)
    buffer = torch.zeros(total, dtype=torch.uint8)
    for a, offset in zip(arrays, offsets):
        buffer.numpy()[offset : offset + a.nbytes] = a.view(np.uint8)
    return buffer, offsets


def test_each_array_starts_aligned_for_any_dtype():
    arrays = [np.zeros(3, np.int32), np.zeros(0, np.int32), np.zeros(2, np.int64), np.zeros(1, np.float32)]
    assert aligned_offsets(arrays) == ([0, 16, 16, 32], 36)


def test_bundles_come_back_by_name_and_none_stays_none():
    pair = Pair(ids=np.array([3, 1, 4], np.int32), weights=np.array([0.5, 2.0], np.float32))
    single = Single(values=np.array([-7, 1 << 40], np.int64))
    buffer, offsets = packed((pair, None, single))
    back_pair, nothing, back_single = views_of((pair, None, single), buffer, offsets)
    assert type(back_pair) is Pair and type(back_single) is Single and nothing is None
    assert back_pair.ids.tolist() == [3, 1, 4] and back_pair.ids.dtype == torch.int32
    assert back_pair.weights.tolist() == [0.5, 2.0] and back_pair.weights.dtype == torch.float32
    assert back_single.values.tolist() == [-7, 1 << 40] and back_single.values.dtype == torch.int64


def test_a_view_finds_its_twin_in_the_other_buffer():
    """What `Staging.pinned` does: the host copy of a device view lies at the same bytes of the
    pinned buffer."""
    pair = Pair(ids=np.array([3, 1, 4], np.int32), weights=np.zeros(0, np.float32))
    host, offsets = packed((pair,))
    device = host.clone()  # stands in for the device buffer after the copy
    [on_device] = views_of((pair,), device, offsets)
    twin = same_place(host_views_by_dtype(host), on_device.ids)
    assert twin.tolist() == [3, 1, 4] and twin.dtype == torch.int32
    assert twin.data_ptr() == host.data_ptr() + offsets[0]
    assert same_place(host_views_by_dtype(host), on_device.weights).numel() == 0


def test_on_the_cpu_a_bundle_wraps_its_arrays_in_place():
    pair = Pair(ids=np.array([3, 1], np.int32), weights=np.array([1.5], np.float32))
    wrapped = on_cpu(pair)
    assert type(wrapped) is Pair and wrapped.ids.tolist() == [3, 1]
    pair.ids[0] = 9  # shares the array's memory: no copy on the CPU path
    assert wrapped.ids.tolist() == [9, 1]
    assert on_cpu(None) is None
