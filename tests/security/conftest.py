"""Fixtures of the security tests: the gateway suite's simulated pods and HTTP client."""

from tests.gateway.conftest import cluster, http

__all__ = ["cluster", "http"]
