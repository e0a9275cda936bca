"""Reading a YAML configuration file into a mapping, with errors that name the file, line and column.

Stricter than ``yaml.safe_load``: a key repeated in one mapping is an error (PyYAML keeps the last one
silently), the document must be a mapping (or absent), and every failure, whatever the text, is a
``YAMLFileError``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.error import Mark, MarkedYAMLError
from yaml.nodes import MappingNode, Node
from yaml.reader import ReaderError

_MERGE_TAG = "tag:yaml.org,2002:merge"


class YAMLFileError(ValueError):
    """A configuration file that cannot be read or is not a YAML mapping; the message names the file."""


def _where(mark: Mark | None) -> str:
    return f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""


class _StrictLoader(yaml.SafeLoader):
    def construct_mapping(self, node: Node, deep: bool = False) -> dict[Any, Any]:
        if not isinstance(node, MappingNode):
            raise ConstructorError(None, None, f"expected a mapping, found {node.tag}", node.start_mark)
        first_seen: dict[Any, Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:  # keys a merge brings in may be overridden
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                earlier = first_seen.setdefault(key, key_node)
            except TypeError:  # unhashable: the base class reports it
                continue
            if earlier is not key_node:
                raise ConstructorError(
                    None,
                    None,
                    f"duplicate key {key!r} (first at line {earlier.start_mark.line + 1})",
                    key_node.start_mark,
                )
        return super().construct_mapping(node, deep=deep)

    def construct_object(self, node: Node, deep: bool = False) -> Any:
        # Always deep, so that a node's constructor runs to its end here, where an error can be given the
        # node's place: SafeLoader's constructors let Python's errors out for some scalars (a 30th of
        # February, a 5,000-digit integer) and some explicit tags (!!timestamp x, !!bool x, !!set [1]).
        try:
            return super().construct_object(node, deep=True)
        except (ArithmeticError, AttributeError, LookupError, TypeError, ValueError) as exc:
            kind = node.tag.rpartition(":")[2]
            problem = str(exc) if isinstance(exc, ValueError) else f"not a valid {kind}"
            raise ConstructorError(None, None, problem, node.start_mark) from None


def parse_yaml_mapping(text: str, source: str, what: str) -> dict[Any, Any] | None:
    """The mapping that ``text`` holds, None if it holds no document (empty, or only comments).

    ``source`` (the file) and ``what`` (what it should hold, e.g. ``"scheduler config"``) are named in
    errors."""
    try:
        data = yaml.load(text, Loader=_StrictLoader)
    except MarkedYAMLError as exc:
        problem = exc.problem or exc.context or "syntax error"
        if exc.problem and exc.context:
            context = exc.context
            if exc.context_mark is not None:
                context += f" at line {exc.context_mark.line + 1}, column {exc.context_mark.column + 1}"
            problem = f"{problem.removeprefix('but ')} ({context})"
        raise YAMLFileError(f"{source}: invalid YAML{_where(exc.problem_mark)}: {problem}") from None
    except ReaderError as exc:  # a character YAML does not allow
        line = text.count("\n", 0, exc.position)
        column = exc.position - (text.rfind("\n", 0, exc.position) + 1)
        raise YAMLFileError(
            f"{source}: invalid YAML (line {line + 1}, column {column + 1}): unacceptable character "
            f"#x{exc.character:04x} ({exc.reason})"
        ) from None
    except RecursionError:
        raise YAMLFileError(f"{source}: invalid YAML: nested too deeply") from None
    if data is not None and not isinstance(data, dict):
        raise YAMLFileError(f"{source}: the {what} must be a mapping, got {type(data).__name__}")
    return data


def load_yaml_mapping(path: str | Path, what: str) -> dict[Any, Any] | None:
    """Read ``path`` (UTF-8) and parse it with ``parse_yaml_mapping``."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise YAMLFileError(f"{path}: cannot read the {what}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise YAMLFileError(f"{path}: the {what} is not UTF-8 text (byte {exc.start})") from None
    return parse_yaml_mapping(text, str(path), what)
