"""``slorouter top``: a live terminal view of a running gateway or picker."""
