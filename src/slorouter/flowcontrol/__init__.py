"""Flow control: requests wait in the router, not in the model servers, while the pool is saturated.

``queue.py`` holds the queued requests (priority bands, fair flows, ordered inside a flow, limits, expiry,
eviction); ``policies.py`` the fairness and ordering policies; ``saturation.py`` says how many more requests
the pool can take; ``controller.py`` ties them to the Director (tickets, outcomes, the dispatch pump,
metrics).
Time comes from the injected clock, so the same code runs behind the gateway and in the benchmark.
"""
