"""Model files load only from the configured directory, within a size bound, and only when they validate;
a refused file leaves the previous model serving."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import aiohttp
import pytest

from slorouter.predictor.features import check_kind
from slorouter.predictor.model_sources import TrainingServerSource
from slorouter.predictor.model_store import ModelFileError, ModelStore
from slorouter.predictor.predictor import Predictor
from slorouter.predictor.training_server import TrainingServer
from tests.helpers import predictor_models as common
from tests.helpers.predictor_models import FAST_TRAINING, republish

trained_dir = common.trained_dir
model_dir = common.model_dir


def _loaded(directory: Path, **options: int) -> Predictor:
    predictor = Predictor(ModelStore(directory, **options))
    assert predictor.refresh()
    return predictor


def _model_file(directory: Path, kind: str, version: str) -> Path:
    return directory / f"{kind}-{version}.model"


def test_kinds_and_versions_cannot_name_a_path(model_dir: Path):
    for kind in ("../ttft", "ttft/../../x", "/etc/passwd", ""):
        with pytest.raises(ValueError):
            check_kind(kind)
    store = ModelStore(model_dir)
    for pointer in ("../../etc/passwd", "/etc/passwd", "v1/../../x", ".hidden", "a\x00b"):
        (model_dir / "ttft.latest").write_text(pointer)
        assert store.latest_version("ttft") is None
        assert store.read_file("ttft") is None


def test_a_symlink_out_of_the_directory_is_refused_and_the_previous_model_kept(
    model_dir: Path, tmp_path: Path
):
    predictor = _loaded(model_dir)
    before = predictor.versions["ttft"]
    new = republish(model_dir, "evil", kinds=("ttft",))["ttft"]
    outside = tmp_path / "outside.model"
    shutil.move(_model_file(model_dir, "ttft", new), outside)  # a valid model file, but elsewhere
    _model_file(model_dir, "ttft", new).symlink_to(outside)
    with pytest.raises(ModelFileError, match="resolves outside the model directory"):
        ModelStore(model_dir).read_file("ttft")
    assert predictor.refresh() is False
    assert predictor.versions["ttft"] == before
    assert "outside the model directory" in predictor.errors["ttft"]


def test_a_symlink_to_the_pointer_outside_gives_no_version(model_dir: Path, tmp_path: Path):
    (tmp_path / "pointer").write_text((model_dir / "ttft.latest").read_text())
    (model_dir / "ttft.latest").unlink()
    (model_dir / "ttft.latest").symlink_to(tmp_path / "pointer")
    assert ModelStore(model_dir).latest_version("ttft") is None


def test_a_symlink_inside_the_directory_is_followed(model_dir: Path):
    store = ModelStore(model_dir)
    version = store.latest_version("ttft")
    assert version is not None
    path = _model_file(model_dir, "ttft", version)
    path.rename(model_dir / "real.bin")
    path.symlink_to(model_dir / "real.bin")
    assert store.load("ttft") is not None


def test_an_oversized_file_is_refused_before_it_is_read(model_dir: Path):
    predictor = _loaded(model_dir)
    before = predictor.versions["ttft"]
    new = republish(model_dir, "big", kinds=("ttft",))["ttft"]
    size = _model_file(model_dir, "ttft", new).stat().st_size
    small = Predictor(ModelStore(model_dir, max_model_bytes=size - 1))
    small.refresh()
    assert small.versions.get("ttft") is None
    assert "over the limit" in small.errors["ttft"]
    with open(_model_file(model_dir, "ttft", new), "ab") as file:  # grown past the bound
        file.truncate(size + 10 * (1 << 20))
    limited = ModelStore(model_dir, max_model_bytes=size + (1 << 20))
    with pytest.raises(ModelFileError, match=f"{size + 10 * (1 << 20)} bytes, over the limit"):
        limited.read_file("ttft")
    assert predictor.refresh() is False and predictor.versions["ttft"] == before


def test_a_corrupted_file_is_refused_and_the_previous_model_kept(model_dir: Path):
    predictor = _loaded(model_dir)
    before = predictor.versions["ttft"]
    new = republish(model_dir, "bad", kinds=("ttft",))["ttft"]
    path = _model_file(model_dir, "ttft", new)
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))
    assert predictor.refresh() is False
    assert predictor.versions["ttft"] == before
    assert "checksum mismatch" in predictor.errors["ttft"]
    path.write_bytes(b"not a model at all")
    republish(model_dir, "bad2", kinds=("tpot",))  # another kind still loads
    assert predictor.refresh() is True and predictor.versions["ttft"] == before


def test_a_fifo_in_place_of_a_model_does_not_hang_the_loader(model_dir: Path):
    predictor = _loaded(model_dir)
    new = republish(model_dir, "fifo", kinds=("ttft",))["ttft"]
    path = _model_file(model_dir, "ttft", new)
    path.unlink()
    os.mkfifo(path)
    assert predictor.refresh() is False
    assert "not a regular file" in predictor.errors["ttft"]


async def test_a_download_over_the_bound_is_refused_and_not_fetched_again(trained_dir: Path, tmp_path: Path):
    training = TrainingServer(
        common.copy_models(trained_dir, tmp_path / "models"), trainer_config=FAST_TRAINING
    )
    await training.start()
    try:
        source = TrainingServerSource(training.url, max_model_bytes=1000)
        predictor = source.make_predictor()
        assert await source.sync(predictor) is False
        assert "over the limit of 1000" in predictor.errors["ttft"]
        assert predictor.versions.get("ttft") is None
        await source.sync(predictor)
        async with aiohttp.ClientSession() as http, http.get(training.url + "/metrics") as resp:
            text = await resp.text()
        # Refused once, then asked with If-None-Match: 304, nothing downloaded again.
        assert 'slorouter_training_model_requests_total{model="ttft",status="200"} 1.0' in text
        assert 'slorouter_training_model_requests_total{model="ttft",status="304"} 1.0' in text
        await source.close()
        for path in ("/v1/models/..%2F..%2Fetc%2Fpasswd", "/v1/models/../../etc/passwd", "/v1/models/%2e%2e"):
            async with aiohttp.ClientSession() as http, http.get(training.url + path) as resp:
                assert resp.status == 404, path
    finally:
        await training.stop()
