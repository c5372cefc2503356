"""Loopback ports for test worlds, shared by the pytest fixtures (conftest) and the scripts the
tests start (the differential harness), which run without pytest: the plugin's own."""

from tensorplay_rpc.testing import free_port

__all__ = ["free_port"]
