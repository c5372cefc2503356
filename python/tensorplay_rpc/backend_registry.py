"""The RPC backends init_rpc can use."""

from __future__ import annotations

import collections
import enum

BackendValue = collections.namedtuple(
    "BackendValue", ["construct_rpc_backend_options_handler", "init_backend_handler"]
)
BackendValue.__doc__ = "The two handlers of a backend: one builds its options, one starts it."


class BackendType(enum.Enum):
    """The registered RPC backends. TENSORPIPE is the built-in one."""

    TENSORPIPE = "TENSORPIPE"

    def __repr__(self) -> str:
        return f"BackendType.{self.name}"
