"""vLLM's own block-hash functions, loaded from an installed vLLM package without importing its engine.

``load(site)`` reads ``vllm/utils/hashing.py`` and ``vllm/v1/core/kv_cache_utils.py`` from the directory
``site`` (a site-packages, or ``pip install --no-deps --target DIR vllm``) and executes them as they are.
Those modules' heavy imports (torch, the engine's configuration, the request and cache-spec classes) are
replaced by empty stand-ins first: the hashing functions (``get_hash_fn_by_name``, ``init_none_hash``,
``hash_block_tokens``, ``generate_block_hash_extra_keys``, ``get_request_block_hasher``,
``maybe_convert_block_hash``) use none of them. Nothing of vLLM is copied into this repository; the tests
that compare against it are skipped where no vLLM is installed (``make vllm-parity`` installs one).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import types
from pathlib import Path
from typing import Any

SITE_ENV = "SLOROUTER_VLLM_SITE"

# Modules the two files import that pull in torch or the engine: stood in by empty ones.
_STUBBED = (
    "vllm.config",
    "vllm.multimodal",
    "vllm.multimodal.utils",
    "vllm.utils.math_utils",
    "vllm.v1.kv_cache_interface",
    "vllm.v1.kv_cache_spec_registry",
    "vllm.v1.request",
    "vllm.v1.utils",
)


class _Stub(types.ModuleType):
    """A module every attribute of which is a fresh empty class (enough for imports and annotations)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = type(name, (), {})
        setattr(self, name, value)
        return value


def site_from_env() -> Path | None:
    value = os.environ.get(SITE_ENV)
    return Path(value) if value else None


def load(site: Path) -> tuple[types.ModuleType, types.ModuleType, str]:
    """``(hashing, kv_cache_utils, version)`` of the vLLM installed under ``site``.

    The modules are registered under private names (``_vllm_reference...``) so a real ``vllm`` package, if
    one is importable, is left alone.
    """
    root = site / "vllm"
    if not (root / "v1" / "core" / "kv_cache_utils.py").is_file():
        raise FileNotFoundError(f"{site} has no vllm/v1/core/kv_cache_utils.py")
    saved = {name: mod for name, mod in sys.modules.items() if name == "vllm" or name.startswith("vllm.")}
    try:
        for name in saved:
            del sys.modules[name]
        for package in ("vllm", "vllm.utils", "vllm.v1", "vllm.v1.core"):
            module = types.ModuleType(package)
            module.__path__ = []
            sys.modules[package] = module
        for name in _STUBBED:
            sys.modules[name] = _Stub(name)
        sys.modules["vllm.multimodal.utils"].get_mm_features_in_window = lambda *a, **k: (0, 0)  # type: ignore[attr-defined]
        envs = types.ModuleType("vllm.envs")
        envs.VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES = True  # type: ignore[attr-defined]  # vLLM's default
        sys.modules["vllm.envs"] = envs
        sys.modules["vllm"].envs = envs  # type: ignore[attr-defined]
        logger = types.ModuleType("vllm.logger")
        logger.init_logger = logging.getLogger  # type: ignore[attr-defined]
        sys.modules["vllm.logger"] = logger
        hashing = _exec("vllm.utils.hashing", root / "utils" / "hashing.py")
        utils = _exec("vllm.v1.core.kv_cache_utils", root / "v1" / "core" / "kv_cache_utils.py")
        version = _version(root)
    finally:
        for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
            del sys.modules[name]
        sys.modules.update(saved)
    return hashing, utils, version


def _exec(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _version(root: Path) -> str:
    namespace: dict[str, Any] = {}
    version_file = root / "_version.py"
    if version_file.is_file():
        exec(compile(version_file.read_text(), str(version_file), "exec"), namespace)
    return f"{namespace.get('__version__', '?')} ({namespace.get('__commit_id__', '?')})"


class FakeRequest:
    """The attributes of ``vllm.v1.request.Request`` that its block hasher reads."""

    def __init__(
        self,
        token_ids: list[int],
        lora: tuple[str, str] | None = None,
        cache_salt: str | None = None,
    ) -> None:
        self.all_token_ids = list(token_ids)
        self.num_tokens = len(token_ids)
        self.block_hashes: list[bytes] = []
        self.mm_features: list[Any] = []
        self.prompt_embeds = None
        self._prompt_embeds_per_block_hashes: dict[Any, bytes] = {}
        self.cache_salt = cache_salt
        self.lora_request = (
            None
            if lora is None
            else types.SimpleNamespace(lora_name=lora[0], lora_path=lora[1], lora_int_id=1)
        )


def digests(
    utils: types.ModuleType,
    hashing: types.ModuleType,
    algorithm: str,
    token_ids: list[int],
    block_size: int,
    lora: tuple[str, str] | None = None,
    cache_salt: str | None = None,
) -> list[bytes]:
    """The block hashes vLLM computes for a request of ``token_ids``: its request block hasher over
    ``hash_block_tokens``, rooted at ``init_none_hash``'s ``NONE_HASH`` (PYTHONHASHSEED of this process)."""
    hash_fn = hashing.get_hash_fn_by_name(algorithm)
    utils.init_none_hash(hash_fn)
    hasher = utils.get_request_block_hasher(block_size, hash_fn)
    return list(hasher(FakeRequest(token_ids, lora, cache_salt)))


def event_hashes(utils: types.ModuleType, digests: list[bytes]) -> list[int]:
    """``digests`` as vLLM's ``BlockStored`` events carry them (``maybe_convert_block_hash``, vLLM's default
    of 64-bit ints)."""
    return [utils.maybe_convert_block_hash(d) for d in digests]
