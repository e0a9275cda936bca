"""The gateway's default bound on requests handled at once: derived from the pool, following its size."""

from __future__ import annotations

from slorouter.gateway.runtime import SLOTS_PER_ENDPOINT, derived_concurrency_limit
from slorouter.pool.state import Endpoint, PoolState
from tests.gateway.conftest import start_router


def test_the_derived_bound_follows_the_pool_and_doubles_with_flow_control() -> None:
    pool = PoolState([Endpoint("a:1"), Endpoint("b:2")])
    plain = derived_concurrency_limit(pool, flow_control=False)
    held = derived_concurrency_limit(pool, flow_control=True)
    assert plain() == 2 * SLOTS_PER_ENDPOINT and held() == 4 * SLOTS_PER_ENDPOINT
    pool.add(Endpoint("c:3"))
    assert plain() == 3 * SLOTS_PER_ENDPOINT
    for address in ("a:1", "b:2", "c:3"):
        pool.remove(address)
    assert plain() == SLOTS_PER_ENDPOINT  # an empty pool still answers (503 "no endpoint"), not "too many"


async def test_a_gateway_without_a_configured_bound_uses_the_derived_one() -> None:
    router = await start_router(["127.0.0.1:9", "127.0.0.1:10"])
    try:
        server = router._server
        assert server is not None and server.concurrency_limit is not None
        assert server.concurrency_limit() == 2 * SLOTS_PER_ENDPOINT
    finally:
        await router.stop()
    configured = await start_router(["127.0.0.1:9"], gateway={"max_concurrent_requests": 7})
    try:
        server = configured._server
        assert server is not None and server.concurrency_limit is None
        assert server.limits.max_concurrent_requests == 7
    finally:
        await configured.stop()
