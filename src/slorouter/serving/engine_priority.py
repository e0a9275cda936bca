"""The priority a request carries to its model server, in the body field and the sense the server takes
(``pool.engine_priority``; docs/design/engine-priority.md).

The router's priorities are higher-first (an objective's ``priority``, or its ``engine_priority``; 0 without
an objective). vLLM (``--scheduling-policy priority``) runs lower values of its body field ``priority``
first, so it gets the negation; SGLang (``--enable-priority-scheduling``) runs higher values first, so it
gets the value as is. The endpoint picked decides the form, so a retry elsewhere may carry another.

The body rewrite is byte-oriented: ``"priority":N,`` goes in right after the body's opening ``{``. A body
is parsed and serialised again only when the client sent a top-level ``priority`` of its own (the router's
replaces it), or when it does not start with ``{`` as UTF-8 (after white space: a byte-order mark, UTF-16 or
UTF-32).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from slorouter.api.routing_headers import RoutingHints
from slorouter.config import Config
from slorouter.pool.config import LOWER_FIRST, EngineOrder, EnginePriorityResolver, engine_priority_resolver
from slorouter.pool.state import Endpoint

FIELD = "priority"
_WHITE = frozenset(b" \t\r\n")
_OPEN, _CLOSE = 0x7B, 0x7D  # { }


def engine_value(priority: int, order: EngineOrder) -> int:
    """The number a server of ``order`` gets for a request of ``priority`` (the router's, higher first)."""
    return -priority if order == LOWER_FIRST else priority


def with_priority(body: bytes, value: int, *, client_priority: bool = False) -> bytes:
    """``body`` (a JSON object, already validated) with the top-level field ``"priority": value``.

    ``client_priority``: the body has a top-level ``priority`` of its own (``ParsedRequest.client_priority``),
    which is replaced, so that the key appears once."""
    if not client_priority:
        start = 0
        end = len(body)
        while start < end and body[start] in _WHITE:
            start += 1
        # A NUL after the brace: UTF-16 or UTF-32 (little-endian), which json reads too; not bytes to splice.
        if end - start >= 2 and body[start] == _OPEN and body[start + 1] != 0:
            rest = start + 1
            while rest < end and body[rest] in _WHITE:
                rest += 1
            empty = rest < end and body[rest] == _CLOSE
            field = b'"priority":%d' % value if empty else b'"priority":%d,' % value
            view = memoryview(body)  # one copy of the body, in the join
            return b"".join((view[: start + 1], field, view[start + 1 :]))
    data = json.loads(body)
    data[FIELD] = value
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate the client escaped: escaped again
        return json.dumps(data, separators=(",", ":")).encode("ascii")


class EnginePriority:
    """The router's engine priorities: each request's value (by its objective) and each endpoint's form.
    Built by ``from_config``, which gives None when no endpoint is sent any."""

    __slots__ = ("_objectives", "_order_of")

    def __init__(self, order_of: EnginePriorityResolver, objectives: Mapping[str, int]) -> None:
        """``order_of``: how an endpoint takes the priority (None: it gets none); ``objectives``: each
        objective's value, higher first."""
        self._order_of = order_of
        self._objectives = dict(objectives)

    @classmethod
    def from_config(cls, config: Config) -> EnginePriority | None:
        pool = config.pool
        if pool is None or not pool.engine_priority_anywhere:
            return None
        return cls(engine_priority_resolver(pool), config.objective_engine_priorities())

    def priority(self, hints: RoutingHints) -> int:
        """A request's value, higher first: its objective's (0 without one)."""
        objective = hints.objective
        return 0 if objective is None else self._objectives.get(objective, 0)

    def order(self, endpoint: Endpoint) -> EngineOrder | None:
        """How ``endpoint`` takes the priority; None: it gets none (the body goes as the client sent it)."""
        return self._order_of(endpoint)

    def body(self, body: bytes, priority: int, endpoint: Endpoint, *, client_priority: bool = False) -> bytes:
        """The request body for ``endpoint``: ``body`` with ``priority`` in its form, or ``body`` itself."""
        order = self._order_of(endpoint)
        if order is None:
            return body
        return with_priority(body, engine_value(priority, order), client_priority=client_priority)

    def same_form(self, endpoints: Sequence[Endpoint]) -> list[Endpoint]:
        """The endpoints that take the priority as the first does (the first included): the only ones one
        rewritten body fits."""
        if not endpoints:
            return []
        first = self._order_of(endpoints[0])
        return [endpoint for endpoint in endpoints if self._order_of(endpoint) == first]
