"""vLLM's KV-cache event protocol: the msgpack wire format, the ZMQ publisher, the simulated hash chain."""
