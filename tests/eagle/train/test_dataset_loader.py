"""The training data loader's fast paths: the NaN/Inf check, ordered multi-worker prefetch, thread-safe cache."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import _train_data as td
import pytest
import torch


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_all_finite_finds_every_kind_of_bad_value(dtype: torch.dtype) -> None:
    from eagle.data.hidden_io import all_finite, check_sample

    x = torch.randn(64, 4, 16).to(dtype)
    assert all_finite(x)
    for bad in (float("nan"), float("inf"), float("-inf")):
        y = x.clone()
        y[17, 3, 5] = bad
        assert not all_finite(y), bad
    y = x.to(torch.bfloat16)
    y[0, 0, 0], y[63, 3, 15] = float("nan"), float("inf")
    problems = check_sample({"hidden_states": y, "token_ids": torch.arange(64)})
    assert problems == ["hidden_states has 2 NaN/Inf values"]


def test_prefetched_keeps_order_with_several_workers() -> None:
    from eagle.train.dataset import prefetched

    def make(i: int) -> int:
        time.sleep(0.002 * ((7 * i) % 5))  # later items often finish first
        return i * i

    items = list(range(23))
    for workers in (1, 3, 8, 40):
        assert list(prefetched(make, items, workers)) == [i * i for i in items]
    assert list(prefetched(make, [], 4)) == []


def test_prefetched_op_threads_set_the_workers_count_and_leave_the_callers() -> None:
    """op_threads=1: the side threads building batches run torch's ops on one thread each, and
    the caller's setting is untouched; by default a side thread keeps torch's default count."""
    import torch

    from eagle.train.dataset import prefetched

    before = torch.get_num_threads()
    seen = list(prefetched(lambda _: torch.get_num_threads(), list(range(6)), 3, op_threads=1))
    assert seen == [1] * 6 and torch.get_num_threads() == before
    assert list(prefetched(lambda _: torch.get_num_threads(), [0, 1], 2, op_threads=2)) == [2, 2]
    if before > 1:  # a fresh thread without the setting gets torch's default, as the caller's
        assert list(prefetched(lambda _: torch.get_num_threads(), [0], 1)) == [before]


def test_prefetched_raises_the_workers_error() -> None:
    from eagle.train.dataset import prefetched

    def make(i: int) -> int:
        if i == 5:
            raise ValueError("sample 5 is broken")
        return i

    got = []
    with pytest.raises(ValueError, match="sample 5"):
        for x in prefetched(make, list(range(10)), 3):
            got.append(x)
    assert got == [0, 1, 2, 3, 4]


def test_loader_workers_on_cpu_is_one() -> None:
    from eagle.train.dataset import loader_workers

    assert loader_workers(torch.device("cpu")) == 1


def test_batches_built_on_threads_equal_sequential_ones(tmp_path: Path) -> None:
    from eagle.train.dataset import HiddenStates, pack_batches

    target = td.make_target(tmp_path / "target")
    data = td.make_data(target, tmp_path / "data", n=12, length=24)
    ref = HiddenStates(data, 64)
    batches = pack_batches(list(range(12)), ref.lengths, 64, seed=0)
    want = [ref.batch(b, torch.device("cpu"), layout=True) for b in batches]
    # a cache that holds about half the samples: threads race to fill it
    shared = HiddenStates(data, 64, cache_bytes=6 * 23 * (3 * 32 + 32) * 4 + 6 * 23 * 8 * 3)
    got: dict[int, dict[str, torch.Tensor]] = {}

    def work(k: int) -> None:
        got[k] = shared.batch(batches[k], torch.device("cpu"), layout=True)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(batches))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k, w in enumerate(want):
        assert all(torch.equal(got[k][key], w[key]) for key in w), k
    assert 0 < shared._cached_bytes <= shared.cache_bytes
    assert shared._cached_bytes == sum(sum(v.numel() * v.element_size() for v in s.values())
                                       for s in shared._cache.values())
