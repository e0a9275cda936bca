"""Keying a recording's prefix-block hashes: the vectorised SipHash-2-4 of slorouter.serving.keyed_hash
against the standard library's keyed hashes called once per value (``hashlib.blake2b(key=...)``, and
``hmac`` with SHA-256), on the batches the recorder's writer thread hashes (the blocks of one or more
requests' prompts). Best of ``--repeat`` runs of each, in one process.

    .venv/bin/python benchmarks/bench_keyed_hash.py [--repeat 7]
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import secrets
import time
from collections.abc import Callable

import numpy as np

from _harness import markdown_table
from slorouter.serving.keyed_hash import siphash24

KEY = secrets.token_bytes(16)


def blake2b_each(values: np.ndarray) -> list[int]:
    return [
        int.from_bytes(hashlib.blake2b(v.to_bytes(8, "little"), key=KEY, digest_size=8).digest(), "little")
        for v in values.tolist()
    ]


def hmac_sha256_each(values: np.ndarray) -> list[int]:
    digest = hmac.digest
    return [
        int.from_bytes(digest(KEY, v.to_bytes(8, "little"), "sha256")[:8], "little") for v in values.tolist()
    ]


def siphash_batch(values: np.ndarray) -> list[int]:
    return siphash24(values, KEY).tolist()


def best_us(fn: Callable[[np.ndarray], list[int]], values: np.ndarray, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        fn(values)
        best = min(best, time.perf_counter() - started)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    # 16 blocks: a 1,000-byte chat; 256: a 16k-byte (4k-token) prompt; 4,096: a writer batch of 16 of those.
    for count in (16, 256, 4096):
        values = rng.integers(0, 2**63, size=count, dtype=np.uint64)
        sip = best_us(siphash_batch, values, args.repeat)
        blake = best_us(blake2b_each, values, args.repeat)
        sha = best_us(hmac_sha256_each, values, args.repeat)
        rows.append([
            f"{count:,}", f"{sip:,.0f}", f"{blake:,.0f}", f"{sha:,.0f}", f"{blake / sip:.1f}×",
        ])  # fmt: skip
    headers = ["hashes", "SipHash-2-4, numpy µs", "blake2b each µs", "HMAC-SHA256 each µs"]
    headers.append("blake2b / SipHash")
    print(markdown_table(headers, rows))


if __name__ == "__main__":
    main()
