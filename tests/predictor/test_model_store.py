from __future__ import annotations

import os
import threading

import pytest

from slorouter.predictor.features import DEFAULT_SCHEMA
from slorouter.predictor.model_store import (
    ModelFileError,
    ModelMetadata,
    ModelStore,
    decode_model_file,
    encode_model_file,
)


def meta(version: str, kind: str = "ttft") -> ModelMetadata:
    return ModelMetadata(
        kind=kind,  # type: ignore[arg-type]
        version=version,
        trained_at=1.7e9,
        sample_count=1234,
        metrics={"mape": 0.1},
        schema=DEFAULT_SCHEMA.to_dict(),
        objective="quantile",
        quantile=0.9,
        target_transform="log",
    )


def payload(i: int) -> bytes:
    return bytes([i % 251]) * (200_000 + i)  # big enough that a torn write would be visible


def test_round_trip_and_metadata(tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = ModelStore(tmp_path)
    assert (
        store.latest_version("ttft") is None
        and store.load("ttft") is None
        and store.read_file("ttft") is None
    )
    assert store.save("ttft", b"model-bytes", meta("v1")) == "v1"
    raw, loaded = store.load("ttft")  # type: ignore[misc]
    assert raw == b"model-bytes" and loaded == meta("v1")
    assert ModelMetadata.from_dict(loaded.to_dict()) == loaded
    assert store.latest_version("ttft") == "v1" and store.latest_version("tpot") is None
    version, data = store.read_file("ttft")  # type: ignore[misc]
    assert version == "v1" and decode_model_file(data) == (b"model-bytes", meta("v1"))


def test_rejects_bad_input(tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = ModelStore(tmp_path)
    with pytest.raises(ValueError, match="metadata is for"):
        store.save("tpot", b"x", meta("v1"))
    with pytest.raises(ValueError, match="invalid model version"):
        store.save("ttft", b"x", meta("../evil"))
    data = encode_model_file(b"abcdef", meta("v1"))
    with pytest.raises(ModelFileError, match="truncated"):
        decode_model_file(data[:-1])
    with pytest.raises(ModelFileError, match="checksum"):
        decode_model_file(data[:-1] + b"X")
    with pytest.raises(ModelFileError, match="magic"):
        decode_model_file(b"joblib")


def test_keeps_only_the_last_versions(tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = ModelStore(tmp_path, keep=3)
    for i in range(6):
        store.save("ttft", payload(i), meta(f"v{i}"))
    store.save("tpot", b"t", meta("t0", "tpot"))
    assert store.versions("ttft") == ["v3", "v4", "v5"] and store.versions("tpot") == ["t0"]
    assert sorted(os.listdir(tmp_path)) == sorted(
        ["ttft-v3.model", "ttft-v4.model", "ttft-v5.model", "ttft.latest", "tpot-t0.model", "tpot.latest"]
    )


def test_reader_racing_a_writer_never_sees_a_torn_or_inconsistent_model(tmp_path) -> None:  # type: ignore[no-untyped-def]
    writer_store = ModelStore(tmp_path, keep=2)
    reader_store = ModelStore(tmp_path, keep=2)
    writer_store.save("ttft", payload(0), meta("v0"))
    stop = threading.Event()
    problems: list[str] = []
    seen: set[str] = set()

    def reader() -> None:
        while not stop.is_set():
            try:
                loaded = reader_store.load("ttft")
            except ModelFileError as exc:
                problems.append(str(exc))
                continue
            if loaded is None:
                problems.append("no model")
                continue
            raw, metadata = loaded
            i = int(metadata.version[1:])
            if raw != payload(i):
                problems.append(f"{metadata.version}: bytes of another version")
            seen.add(metadata.version)

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for i in range(1, 60):
        writer_store.save("ttft", payload(i), meta(f"v{i}"))
    stop.set()
    for t in threads:
        t.join()
    assert not problems
    assert len(seen) > 1  # the readers really raced the writer
    assert reader_store.latest_version("ttft") == "v59"
