"""What the Go core logs, forwarded to Python's logging under ``tensorplay_rpc.core`` (at the
level ``TENSORPLAY_RPC_LOG_LEVEL`` sets)."""

from __future__ import annotations

import atexit
import logging
import os

from ._native import pybind as _go

logger = logging.getLogger(__name__)

# What the Go core logs, forwarded (forward_go_logs).
go_logger = logging.getLogger("tensorplay_rpc.core")

# TENSORPLAY_RPC_LOG_LEVEL (debug, info, warning, error): the least level of the Go core's
# records that reach Python's logging; warning by default.
LOG_LEVEL_ENV = "TENSORPLAY_RPC_LOG_LEVEL"
_GO_LEVELS = {-4: logging.DEBUG, 0: logging.INFO, 4: logging.WARNING, 8: logging.ERROR}


def _set_go_log_level() -> None:
    name = os.environ.get(LOG_LEVEL_ENV, "warning").strip().upper()
    level = logging.getLevelName(name)
    if not isinstance(level, int):
        logger.warning("%s=%r is no log level (debug, info, warning, error): using warning", LOG_LEVEL_ENV, name.lower())
        level = logging.WARNING
    _go.SetLogLevel(level)


_set_go_log_level()


def forward_go_logs() -> None:
    """Log, under ``tensorplay_rpc.core``, what the Go core logged since the last call."""
    records = _go.TakeLogs()
    if not records:
        return
    for record in records.split(_go.LogRecordSeparator):
        level, _, text = record.partition("\t")
        go_logger.log(_GO_LEVELS.get(int(level) if level.lstrip("-").isdigit() else 4, logging.WARNING), "%s", text)


atexit.register(forward_go_logs)  # what is logged after the last drain (shutdown)
