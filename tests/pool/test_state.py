from __future__ import annotations

from slorouter.pool.state import Endpoint, PoolState


def test_incarnation_changes_when_an_endpoint_comes_back() -> None:
    pool = PoolState([Endpoint("a:1"), Endpoint("b:2")])
    first = pool.incarnation("a:1")
    assert first is not None and first != pool.incarnation("b:2")
    pool.remove("a:1")
    assert pool.incarnation("a:1") is None
    pool.add(Endpoint("a:1"))
    assert pool.incarnation("a:1") not in (None, first)
    assert pool.position("a:1") == 1
