"""Where the prediction server gets its models: a shared model directory, or the training server.

A source loads a model only when its version changes: ``DirectorySource`` through ``Predictor.refresh``,
``TrainingServerSource`` by ``GET /v1/models/{kind}`` with ``If-None-Match`` (a version it refused, of
another schema say, is not downloaded again either).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from slorouter.http.auth import bearer_header
from slorouter.predictor.features import MODEL_KINDS, ModelKind, SchemaMismatchError
from slorouter.predictor.model_store import MAX_MODEL_BYTES, ModelFileError, ModelStore, decode_model_file
from slorouter.predictor.predictor import Predictor

log = logging.getLogger("slorouter.predictor.model_sources")


class ModelSource(Protocol):
    """Where the prediction server gets its models from."""

    def describe(self) -> dict[str, Any]: ...

    def make_predictor(self) -> Predictor: ...

    async def sync(self, predictor: Predictor) -> bool:
        """Load any model whose version changed; True if something new was loaded."""
        ...

    async def close(self) -> None: ...


class DirectorySource:
    """Models from a shared model directory (written atomically by a trainer)."""

    def __init__(self, directory: str | Path, *, max_model_bytes: int = MAX_MODEL_BYTES) -> None:
        self.directory = Path(directory)
        self.max_model_bytes = max_model_bytes

    def describe(self) -> dict[str, Any]:
        return {"type": "directory", "path": str(self.directory), "max_model_bytes": self.max_model_bytes}

    def make_predictor(self) -> Predictor:
        return Predictor(ModelStore(self.directory, max_model_bytes=self.max_model_bytes))

    async def sync(self, predictor: Predictor) -> bool:
        # Reading and parsing a model file is blocking work: keep it off the event loop.
        return await asyncio.to_thread(predictor.refresh)

    async def close(self) -> None:
        return None


class TrainingServerSource:
    """Models downloaded from the training server, each only when its ETag (the version) changes."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 10.0,
        session: aiohttp.ClientSession | None = None,
        tokens: Sequence[str] = (),
        max_model_bytes: int = MAX_MODEL_BYTES,
    ) -> None:
        self.url = url.rstrip("/")
        self._auth = bearer_header(tokens)
        self.max_model_bytes = max_model_bytes
        self.timeout_s = timeout_s
        self._session = session
        self._own_session = session is None
        self._refused: dict[str, str] = {}

    def describe(self) -> dict[str, Any]:
        return {"type": "training-server", "url": self.url, "max_model_bytes": self.max_model_bytes}

    def make_predictor(self) -> Predictor:
        return Predictor()

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            # The model metadata header can outgrow aiohttp's 8 KiB default.
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s), max_field_size=1024 * 1024
            )
        return self._session

    async def sync(self, predictor: Predictor) -> bool:
        session = self._get_session()
        changed = False
        for kind in MODEL_KINDS:
            current = predictor.versions.get(kind)
            # Versions this server refused (another schema, say) are not downloaded again either.
            known = [v for v in (current, self._refused.get(kind)) if v]
            headers = {"If-None-Match": ", ".join(f'"{v}"' for v in known)} if known else {}
            headers.update(self._auth)
            async with session.get(f"{self.url}/v1/models/{kind}", headers=headers) as response:
                if response.status in (304, 404):
                    continue
                if response.status != 200:
                    text = (await response.text())[:200]
                    raise RuntimeError(f"GET /v1/models/{kind}: HTTP {response.status}: {text}")
                version = response.headers.get("ETag", "").strip('"')
                try:
                    data = await self._read_bounded(response)
                except ModelFileError as exc:
                    self._refuse(predictor, kind, version, exc)
                    continue
            try:
                await asyncio.to_thread(self._load, predictor, kind, data)
            except (ModelFileError, SchemaMismatchError, ValueError) as exc:
                self._refuse(predictor, kind, version, exc)
                continue
            changed = True
        return changed

    def _refuse(self, predictor: Predictor, kind: ModelKind, version: str, exc: Exception) -> None:
        """Keep the model loaded now; do not download ``version`` again."""
        self._refused[kind] = version
        predictor.errors[kind] = str(exc)
        log.error("refused %s model %s from %s: %s", kind, version, self.url, exc)

    async def _read_bounded(self, response: aiohttp.ClientResponse) -> bytes:
        """The body, refused (``ModelFileError``) past ``max_model_bytes`` before more of it is read."""
        limit = self.max_model_bytes
        if response.content_length is not None and response.content_length > limit:
            raise ModelFileError(f"the model is {response.content_length} bytes, over the limit of {limit}")
        data = bytearray()
        async for chunk in response.content.iter_chunked(1 << 16):
            data += chunk
            if len(data) > limit:
                raise ModelFileError(f"the model is over the limit of {limit} bytes")
        return bytes(data)

    @staticmethod
    def _load(predictor: Predictor, kind: ModelKind, data: bytes) -> None:
        raw, metadata = decode_model_file(data)
        predictor.load_raw(kind, raw, metadata)

    async def close(self) -> None:
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None


def make_source(
    *,
    model_dir: str | None = None,
    training_server: str | None = None,
    tokens: Sequence[str] = (),
    max_model_bytes: int = MAX_MODEL_BYTES,
) -> DirectorySource | TrainingServerSource:
    if (model_dir is None) == (training_server is None):
        raise ValueError("give exactly one of model_dir and training_server")
    if model_dir is not None:
        return DirectorySource(model_dir, max_model_bytes=max_model_bytes)
    assert training_server is not None
    return TrainingServerSource(training_server, tokens=tokens, max_model_bytes=max_model_bytes)
