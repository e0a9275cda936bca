"""Prefix-cache affinity: the approximate producer and its index (``approx``, ``index``), the scorer, and the
precise producer that reads the pods' KV events (``precise``, ``pod_hashing``)."""
