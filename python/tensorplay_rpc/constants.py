"""Defaults shared by the API and the options, as torch.distributed.rpc defines them."""

__all__ = [
    "AGENT_NOT_SET",
    "DEFAULT_INIT_METHOD",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "DEFAULT_NUM_WORKER_THREADS",
    "DEFAULT_RPC_TIMEOUT_SEC",
    "DEFAULT_SHUTDOWN_TIMEOUT",
    "UNSET_RPC_TIMEOUT",
    "WAIT_SLICE_S",
]

DEFAULT_RPC_TIMEOUT_SEC: float = 60.0
DEFAULT_INIT_METHOD: str = "env://"
DEFAULT_NUM_WORKER_THREADS: int = 16
# A timeout argument left at this value means "use the agent's rpc_timeout".
UNSET_RPC_TIMEOUT: float = -1.0
# 0 means a graceful shutdown waits as long as the slowest worker.
DEFAULT_SHUTDOWN_TIMEOUT: float = 0
# The most bytes one call or reply may carry.
DEFAULT_MAX_MESSAGE_SIZE: int = 4 << 30
# Blocking waits return to Python within this, so Ctrl-C is seen promptly: a signal reaches
# Python only between calls into Go, and a condition wait wakes for it only on its own timeout.
# A main thread's wait in Go that lasts longer is ended by the signal itself (_interrupts).
WAIT_SLICE_S: float = 0.1
# What every call that needs this process's agent raises before init_rpc and after shutdown
# (torch's words, which scripts match on; the public calls say "has not been initialized").
AGENT_NOT_SET: str = (
    "Current RPC agent is not set! Did you initialize the RPC framework (e.g. by calling `rpc.init_rpc`)?"
)
