"""The owner's side of RRefs: the values this worker owns, by RRef id.

Go keeps the reference counts and the fork protocol (core/rref.go) and tells the agent when a
value is referenced nowhere any more; this table keeps the values themselves.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, Set, Tuple

from .futures import Future, InternalFuture

Id = Tuple[int, int]  # an RRef or fork id: (creator worker id, local number)


class OwnerTable:
    """The values this worker owns, by RRef id, each as a future of its creation."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._slots: Dict[Id, Future[Any]] = {}
        # Whose creation has begun here.
        self._created: Set[Id] = set()
        # Dropped before their creation began (the creator let go at once): not to be kept.
        self._dropped: Set[Id] = set()

    def slot(self, rref_id: Id) -> Future[Any]:
        """The value's future, made pending if its creation has not started yet."""
        with self._lock:
            fut = self._slots.get(rref_id)
            if fut is None:
                fut = self._slots[rref_id] = InternalFuture()
            return fut

    def creation_slot(self, rref_id: Id) -> Future[Any]:
        """The future a creation completes (every RRef's value is made through here once); a
        throwaway one if the RRef was already dropped."""
        with self._lock:
            if rref_id in self._dropped:
                self._dropped.discard(rref_id)
                return InternalFuture()
            self._created.add(rref_id)
            fut = self._slots.get(rref_id)
            if fut is None:
                fut = self._slots[rref_id] = InternalFuture()
            return fut

    def drop(self, rref_id: Id) -> None:
        """Forget a value no one references any more."""
        with self._lock:
            self._slots.pop(rref_id, None)
            if rref_id in self._created:
                self._created.discard(rref_id)
            else:  # its creation is still to come: it must not keep the value
                self._dropped.add(rref_id)

    def __len__(self) -> int:
        """Entries held: values, and drops waiting for their creation."""
        with self._lock:
            return len(self._slots) + len(self._dropped)
