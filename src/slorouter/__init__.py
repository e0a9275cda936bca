"""slorouter: predicted-latency routing for LLM inference pools."""

__version__ = "0.1.0"
