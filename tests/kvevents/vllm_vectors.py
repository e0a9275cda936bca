"""Block hashes computed by vLLM's own code, for the tests to compare against.

``data/vllm_block_hashes.json`` holds cases (token ids, block size, hash algorithm, ``PYTHONHASHSEED``, LoRA
adapter, cache salt) with the hashes vLLM's ``BlockStored`` events carry for them, written by
``python -m tests.kvevents.make_vllm_vectors SITE`` from the vLLM installed under ``SITE`` (its version is in
the file). The tests read the file, so they need no vLLM; with ``SLOROUTER_VLLM_SITE`` set they also ask
that vLLM directly (``vllm_reference``).
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from . import vllm_reference

VECTORS = Path(__file__).parent / "data" / "vllm_block_hashes.json"


@dataclass(frozen=True)
class Case:
    name: str
    algorithm: str
    seed: str | None  # the pod's PYTHONHASHSEED; None: unset
    block_size: int
    token_ids: list[int]
    lora: tuple[str, str] | None = None
    cache_salt: str | None = None

    def key(self) -> str:
        return json.dumps({k: v for k, v in asdict(self).items() if k != "name"}, sort_keys=True)


EXTRA_KEYS: list[tuple[tuple[str, str] | None, str | None]] = [
    (None, None),
    (("sql-lora", "/adapters/sql"), None),
    (None, "s1"),
    (("a", "/p"), "t"),
]


def generated_cases() -> list[Case]:
    """The file's generic cases: every algorithm, seeded and unseeded (SHA-256 only), several block sizes,
    with and without extra keys; token ids of every encoding width (1 to 4 bytes, up to 2**31 - 1)."""
    rng = random.Random(20261204)
    cases = []
    for algorithm in ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor"):
        seeds: list[str | None] = ["0", "42"] if algorithm.startswith("xxhash") else [None, "0", "42"]
        for seed in seeds:
            for block_size in (1, 3, 16):
                for lora, salt in EXTRA_KEYS:
                    width = rng.choice((255, 65_535, 2**31 - 1))
                    tokens = [rng.randint(0, width) for _ in range(rng.randint(0, 3 * block_size + 5))]
                    name = f"{algorithm}-{seed}-{block_size}-{lora is not None}-{salt is not None}"
                    cases.append(Case(name, algorithm, seed, block_size, tokens, lora, salt))
    return cases


def with_seed(seed: str | None) -> Any:
    """A context manager setting (or unsetting) PYTHONHASHSEED, which vLLM's init_none_hash reads."""

    class _Seed:
        def __enter__(self) -> None:
            self.saved = os.environ.get("PYTHONHASHSEED")
            if seed is None:
                os.environ.pop("PYTHONHASHSEED", None)
            else:
                os.environ["PYTHONHASHSEED"] = seed

        def __exit__(self, *exc: object) -> None:
            if self.saved is None:
                os.environ.pop("PYTHONHASHSEED", None)
            else:
                os.environ["PYTHONHASHSEED"] = self.saved

    return _Seed()


def vllm_digests(hashing: ModuleType, utils: ModuleType, case: Case) -> list[bytes]:
    with with_seed(case.seed):
        return vllm_reference.digests(
            utils, hashing, case.algorithm, case.token_ids, case.block_size, case.lora, case.cache_salt
        )


@dataclass(frozen=True)
class Recorded:
    """What vLLM computed for a case: the block digests, and the hashes its KV events carry."""

    digests: list[bytes]
    event_hashes: list[int]


def load_vectors() -> tuple[str, list[tuple[Case, Recorded]]]:
    """(vLLM version, [(case, what vLLM computed)]) from the file."""
    data = json.loads(VECTORS.read_text(encoding="utf-8"))
    cases = []
    for entry in data["cases"]:
        lora = entry["lora"]
        case = Case(
            entry["name"],
            entry["algorithm"],
            entry["seed"],
            entry["block_size"],
            entry["token_ids"],
            None if lora is None else (lora[0], lora[1]),
            entry["cache_salt"],
        )
        digests = [bytes.fromhex(d) for d in entry["digests"]]
        cases.append((case, Recorded(digests, entry["event_hashes"])))
    return data["vllm"], cases


def ask_vllm(hashing: ModuleType, utils: ModuleType, case: Case) -> Recorded:
    digests = vllm_digests(hashing, utils, case)
    return Recorded(digests, vllm_reference.event_hashes(utils, digests))


def recorded(case: Case) -> Recorded:
    """What vLLM computes for ``case``: asked of vLLM when ``SLOROUTER_VLLM_SITE`` is set, else read from the
    file (where the case must be)."""
    site = vllm_reference.site_from_env()
    if site is not None:
        hashing, utils, _ = vllm_reference.load(site)
        return ask_vllm(hashing, utils, case)
    for known, found in load_vectors()[1]:
        if known.key() == case.key():
            return found
    raise LookupError(f"case {case.name} is not in {VECTORS.name}: regenerate it (make_vllm_vectors)")
