"""``slorouter bench``: a discrete-event cluster benchmark of routing policies on realistic workloads."""
