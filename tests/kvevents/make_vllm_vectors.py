"""Write ``data/vllm_block_hashes.json`` from an installed vLLM (``python -m tests.kvevents.make_vllm_vectors
SITE``).

``SITE`` is a directory with the ``vllm`` package (``pip install --no-deps --target SITE vllm==VERSION``).
The file holds the generic cases of ``vllm_vectors.generated_cases`` and the end-to-end tests' prompts
(``tests.helpers.vllm_prompts.e2e_cases``), each with the hashes vLLM gives it.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

from tests.helpers.vllm_prompts import e2e_cases
from tests.kvevents import vllm_reference
from tests.kvevents.vllm_vectors import VECTORS, ask_vllm, generated_cases


def main(site: str) -> None:
    hashing, utils, version = vllm_reference.load(Path(site))
    entries = []
    for case in [*generated_cases(), *e2e_cases()]:
        found = ask_vllm(hashing, utils, case)
        digests = [d.hex() for d in found.digests]
        entries.append({**asdict(case), "digests": digests, "event_hashes": found.event_hashes})
    text = json.dumps({"vllm": version, "cases": entries}, separators=(",", ":"))
    VECTORS.write_text(text + "\n", encoding="utf-8")
    print(f"{len(entries)} cases from vLLM {version} written to {VECTORS}")


if __name__ == "__main__":
    main(sys.argv[1])
