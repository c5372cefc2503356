"""WorkerInfo: the name and id of a worker."""

from __future__ import annotations

import re
from typing import Tuple, Type

__all__ = ["WorkerInfo"]

_NAME = re.compile(r"[A-Za-z0-9_:-]*")
_MAX_NAME_LENGTH = 128


class WorkerInfo:
    """A worker of the RPC world: its unique ``name`` and its ``id`` (its rank)."""

    __slots__ = ("_name", "_id")

    def __init__(self, name: str, id: int) -> None:
        # The same rules, and words, as torch's WorkerInfo: scripts match on them.
        if not isinstance(name, str) or not _NAME.fullmatch(name) or not 0 < len(name) < _MAX_NAME_LENGTH:
            raise RuntimeError(
                f"Worker name must match ^[A-Za-z0-9-_:]*$, and must be non-empty and shorter than {_MAX_NAME_LENGTH} chars, but got {name}"
            )
        if not isinstance(id, int):
            raise TypeError(f"WorkerInfo(): id must be an int, got {type(id).__name__}")
        self._name = name
        self._id = int(id)

    @property
    def name(self) -> str:
        """The worker's name."""
        return self._name

    @property
    def id(self) -> int:
        """The worker's id, equal to its rank."""
        return self._id

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, WorkerInfo):
            return NotImplemented
        return self._id == other._id and self._name == other._name

    def __hash__(self) -> int:
        return hash((self._id, self._name))

    def __repr__(self) -> str:
        return f"WorkerInfo(id={self._id}, name={self._name})"

    __str__ = __repr__

    def __reduce__(self) -> Tuple[Type[WorkerInfo], Tuple[str, int]]:
        return (WorkerInfo, (self._name, self._id))
