"""vLLM's block-hash chain as the precise-prefix producer computes it (slorouter.kvevents.vllm_hash), per
prompt, for each ``--prefix-caching-hash-algo``, beside the simulator's chain; for ``sha256_cbor`` also the
chain with every block's tuple encoded by ``cbor2`` (what the encoder written here replaces). Best of
``--repeat`` runs, one process, 16-token blocks.

    .venv/bin/python benchmarks/bench_vllm_hash.py [--tokens 4096] [--repeat 7]
"""

from __future__ import annotations

import argparse
import hashlib
import time
from collections.abc import Callable

import cbor2
import numpy as np

from _harness import markdown_table
from slorouter.kvevents.sim_hash import block_hashes as sim_block_hashes
from slorouter.kvevents.vllm_hash import HASH_ALGORITHMS, VllmBlockHasher

BLOCK = 16


def cbor2_chain(hasher: VllmBlockHasher, tokens: list[int]) -> list[bytes]:
    """sha256_cbor with cbor2 encoding each block's (parent, tokens, extra keys) tuple."""
    parent = hasher.none_hash
    out = []
    for start in range(0, len(tokens) - BLOCK + 1, BLOCK):
        block = (parent, tuple(tokens[start : start + BLOCK]), None)
        parent = hashlib.sha256(cbor2.dumps(block, canonical=True)).digest()
        out.append(parent)
    return out


def best_ms(fn: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    tokens = np.random.default_rng(0).integers(0, 150_000, size=args.tokens).tolist()
    token_bytes = np.asarray(tokens, dtype="<u4").tobytes()
    rows = [
        [
            "simulator's xxh3 chain",
            f"{best_ms(lambda: sim_block_hashes(token_bytes, BLOCK), args.repeat):.2f}",
        ]
    ]
    for algorithm in HASH_ALGORITHMS:
        hasher = VllmBlockHasher(algorithm, python_hash_seed="0")
        rows.append(
            [f"vLLM `{algorithm}`", f"{best_ms(lambda h=hasher: h.digests(tokens, BLOCK), args.repeat):.2f}"]
        )
    sha_cbor = VllmBlockHasher("sha256_cbor", python_hash_seed="0")
    assert cbor2_chain(sha_cbor, tokens) == sha_cbor.digests(tokens, BLOCK)
    rows.append(
        [
            "vLLM `sha256_cbor`, each block through cbor2",
            f"{best_ms(lambda: cbor2_chain(sha_cbor, tokens), args.repeat):.2f}",
        ]
    )
    print(markdown_table(["hash chain", f"ms per {args.tokens:,}-token prompt"], rows))


if __name__ == "__main__":
    main()
