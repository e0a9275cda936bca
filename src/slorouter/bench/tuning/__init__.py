"""The self-tuning router's tuner: a twin of the pool (the benchmark's simulator, fitted to what the router
observes of each pod) replays the router's recent traffic under candidate pipelines, and the tuner switches
the live pipeline when the twin predicts a gain larger than its own error (docs/self-tuning.md)."""
