"""Memory and lookup time of the KV-event block index (``slorouter.pool.kv_index``) for a pool of pods.

    PYTHONPATH=src .venv/bin/python benchmarks/kv_index_memory.py --pods 100 --blocks 29205 --shared 0.5

Each pod's cache is filled with ``--blocks`` 64-bit block hashes (llama3-8b-h100 holds 29,205 blocks of 16
tokens), a ``--shared`` fraction of them common to every pod (system prompts), the rest its own. Reports
the index's memory (tracemalloc, with the batches decoded from msgpack as the subscriber does, so the hash
objects the index keeps are counted) and the time of one ``match`` of a 256-block prompt over all pods.
"""

from __future__ import annotations

import argparse
import random
import time
import tracemalloc

from slorouter.kvevents.wire import BlockStored, KVEventBatch, decode_batch, encode_batch
from slorouter.pool.kv_index import KVBlockIndex


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, default=100)
    parser.add_argument("--blocks", type=int, default=29_205)
    parser.add_argument("--shared", type=float, default=0.0)
    args = parser.parse_args()
    rng = random.Random(0)
    shared_count = int(args.blocks * args.shared)
    shared = [rng.getrandbits(64) for _ in range(shared_count)]
    batches = []
    for _ in range(args.pods):
        own = [rng.getrandbits(64) for _ in range(args.blocks - shared_count)]
        hashes = shared + own
        events = [
            BlockStored(hashes[i : i + 512], None, [], 16, None, "GPU", None)
            for i in range(0, len(hashes), 512)
        ]
        batches.append(encode_batch(KVEventBatch(0.0, events)))
    tracemalloc.start()
    index = KVBlockIndex()
    for pod, payload in enumerate(batches):
        index.apply(f"pod-{pod}", decode_batch(payload))
    current, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del batches
    entries = args.pods * args.blocks
    prompt = shared[:256] if shared else [rng.getrandbits(64) for _ in range(256)]
    pods = [f"pod-{p}" for p in range(args.pods)]
    runs = 200
    started = time.perf_counter()
    for _ in range(runs):
        index.match(prompt, pods)
    match_us = (time.perf_counter() - started) / runs * 1e6
    print(
        f"{args.pods} pods × {args.blocks:,} blocks ({args.shared:.0%} shared): "
        f"{index.distinct_blocks:,} distinct hashes, index {current / 2**20:,.0f} MiB = "
        f"{current / entries:.0f} B per (pod, block); "
        f"match of 256 blocks over {args.pods} pods {match_us:,.0f} µs"
    )


if __name__ == "__main__":
    main()
