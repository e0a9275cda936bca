from __future__ import annotations

import threading

import numpy as np
import pytest

from slorouter.predictor.features import FeatureError
from slorouter.predictor.store import SampleStore, StoreConfig
from tests.helpers.predictor_models import synthetic


def ttft_rows(
    n: int, *, waiting: float = 0, kv: float = 0.0, prefix: float = 0.0, start: float = 0
) -> np.ndarray:
    X = np.zeros((n, 8), dtype=np.float32)
    X[:, 0] = kv
    X[:, 1] = start + np.arange(n)  # input length doubles as a sample id
    X[:, 2] = waiting
    X[:, 6] = prefix
    return X


def test_bucket_edges() -> None:
    store = SampleStore()
    X = np.zeros((8, 8), dtype=np.float32)
    X[:, 2] = [0, 1, 2, 3, 6, 7, 14, 1000]
    queue = store.bucket_of("ttft", X) // (20 * 4)
    assert queue.tolist() == [0, 1, 1, 2, 2, 3, 3, 4]
    X = np.zeros((4, 8), dtype=np.float32)
    X[:, 0] = [0.0, 0.049, 0.05, 1.0]
    X[:, 6] = [0.0, 0.24, 0.25, 1.0]
    buckets = store.bucket_of("ttft", X)
    assert (buckets // 4 % 20).tolist() == [0, 0, 1, 19]
    assert (buckets % 4).tolist() == [0, 0, 1, 3]
    assert store.bucket_name(int(buckets[3])) == "queue_0_kv_19_prefix_3"
    tpot = np.zeros((1, 7), dtype=np.float32)
    tpot[0, 0] = 1.0
    assert store.bucket_name(int(store.bucket_of("tpot", tpot)[0])) == "queue_0_kv_19_prefix_0"


def test_per_bucket_eviction_keeps_the_newest() -> None:
    store = SampleStore(StoreConfig(per_bucket=10))
    store.add("ttft", ttft_rows(25), np.ones(25))  # one bucket: ids 0..24, keeps 15..24
    store.add("ttft", ttft_rows(3, waiting=20, start=100), np.ones(3))  # a rare regime
    X, _ = store.training_arrays("ttft")
    assert sorted(X[:, 1].tolist()) == [*range(15, 25), 100, 101, 102]
    store.add("ttft", ttft_rows(7, start=200), np.ones(7))  # evicts the 7 oldest of the busy bucket only
    X, _ = store.training_arrays("ttft")
    assert sorted(X[:, 1].tolist()) == [22, 23, 24, 100, 101, 102, *range(200, 207)]
    assert X[:, 1].tolist() == [22, 23, 24, 100, 101, 102, *range(200, 207)]  # oldest first
    assert store.bucket_counts("ttft") == {"queue_0_kv_0_prefix_0": 10, "queue_4_kv_0_prefix_0": 3}
    assert store.count("ttft") == 13 and store.count("tpot") == 0


def test_memory_is_bounded() -> None:
    store = SampleStore(StoreConfig(per_bucket=50))
    before = store.memory_bytes()
    rng = np.random.default_rng(0)
    for _ in range(20):
        X = ttft_rows(5000)
        X[:, 0] = rng.random(5000)
        X[:, 2] = rng.integers(0, 30, 5000)
        X[:, 6] = rng.random(5000)
        store.add("ttft", X, rng.random(5000) + 1)
    assert store.count("ttft") <= 400 * 50
    assert store.memory_bytes() == before
    assert max(store.bucket_counts("ttft").values()) == 50


def test_rejects_bad_latencies_and_shapes_atomically() -> None:
    store = SampleStore()
    with pytest.raises(FeatureError, match=r"latency_ms\[1\]: must be a positive finite number"):
        store.add("ttft", ttft_rows(3), np.array([1.0, 0.0, 2.0]))
    with pytest.raises(FeatureError, match=r"latency_ms\[0\]"):
        store.add("ttft", ttft_rows(1), np.array([np.nan]))
    with pytest.raises(FeatureError, match="8 feature columns"):
        store.add("ttft", np.zeros((2, 7), dtype=np.float32), np.ones(2))
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(FeatureError, match=r"latency_ms\[0\]: must be a positive finite number"):
            store.add_row("ttft", ttft_rows(1)[0], bad)
    with pytest.raises(FeatureError, match="8 feature columns"):
        store.add_row("ttft", np.zeros(7, dtype=np.float32), 1.0)
    assert store.count("ttft") == 0


def test_added_since_training() -> None:
    store = SampleStore()
    store.add("tpot", np.zeros((5, 7), dtype=np.float32), np.ones(5))
    snap = store.snapshot("tpot")
    store.add("tpot", np.zeros((2, 7), dtype=np.float32), np.ones(2))
    store.mark_trained("tpot", snap.total_added)
    assert store.added_since_training("tpot") == 2 and store.added_since_training("ttft") == 0


def test_concurrent_adds_and_snapshots() -> None:
    store = SampleStore(StoreConfig(per_bucket=100))
    errors: list[BaseException] = []

    def writer(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for _ in range(200):
                X = ttft_rows(50)
                X[:, 0] = rng.random(50)
                X[:, 1] = seed  # rows carry their writer's id
                store.add("ttft", X, np.full(50, float(seed + 1)))
        except BaseException as exc:
            errors.append(exc)

    def reader() -> None:
        try:
            for _ in range(200):
                snap = store.snapshot("ttft")
                assert len(snap.X) == len(snap.y) == len(snap.seq)
                assert np.all(np.diff(snap.seq) > 0)
                assert np.all(snap.y == snap.X[:, 1] + 1)  # rows and latencies never torn apart
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(s,)) for s in range(4)] + [
        threading.Thread(target=reader)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert store.total_added("ttft") == 4 * 200 * 50
    assert store.count("ttft") == sum(store.bucket_counts("ttft").values()) <= 20 * 100


def test_single_row_adds_match_one_batch_add() -> None:
    x, y, _, _ = synthetic(3000, seed=7)
    x[:, 2] = np.random.default_rng(1).integers(0, 40, len(x))  # spread over the queue buckets too
    one_by_one = SampleStore(StoreConfig(per_bucket=20))
    for i in range(len(x)):
        one_by_one.add("ttft", x[i : i + 1], y[i : i + 1])
    batch = SampleStore(StoreConfig(per_bucket=20))
    batch.add("ttft", x, y)
    a, b = one_by_one.snapshot("ttft"), batch.snapshot("ttft")
    order_a, order_b = np.argsort(a.seq), np.argsort(b.seq)
    np.testing.assert_array_equal(a.seq[order_a], b.seq[order_b])
    np.testing.assert_array_equal(a.X[order_a], b.X[order_b])
    np.testing.assert_array_equal(a.y[order_a], b.y[order_b])
    assert one_by_one.bucket_counts("ttft") == batch.bucket_counts("ttft")


def test_add_row_matches_one_batch_add() -> None:
    x, y, _, _ = synthetic(2500, seed=3)  # more than the rows kept pending, so they are written twice
    x[:, 2] = np.random.default_rng(2).integers(0, 40, len(x))
    rows = SampleStore(StoreConfig(per_bucket=20))
    for i in range(len(x)):
        rows.add_row("ttft", x[i], float(y[i]))
        if i == 1500:
            assert rows.total_added("ttft") == 1501
            reference = SampleStore(StoreConfig(per_bucket=20))
            reference.add("ttft", x[:1501], y[:1501])
            assert rows.count("ttft") == reference.count("ttft")
    batch = SampleStore(StoreConfig(per_bucket=20))
    batch.add("ttft", x, y)
    a, b = rows.snapshot("ttft"), batch.snapshot("ttft")
    np.testing.assert_array_equal(a.seq, b.seq)
    np.testing.assert_array_equal(a.X, b.X)
    np.testing.assert_array_equal(a.y, b.y)
    assert rows.bucket_counts("ttft") == batch.bucket_counts("ttft")
    assert rows.total_added("ttft") == batch.total_added("ttft") == len(x)


def test_add_row_rejects_non_finite_features() -> None:
    store = SampleStore()
    row = ttft_rows(1)[0]
    row[3] = np.nan
    with pytest.raises(FeatureError, match="NaN or infinite"):
        store.add_row("ttft", row, 1.0)
    assert store.count("ttft") == 0 and store.total_added("ttft") == 0
