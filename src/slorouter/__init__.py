"""slorouter: predicted-latency routing for LLM inference pools."""

import os

# gRPC's fork handlers (on by default since grpcio 1.81) restart its poller in a child forked to run a
# program; the child can then die before it runs it. slorouter forks only to start programs (Envoy, picker
# workers, the tuner: ``children.stop_with_parent`` needs a fork), so the handlers are turned off before
# anything imports grpc. An operator's own setting is kept.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

__version__ = "0.1.0"
