"""One bounded, thread-safe cache of loop functions and runners.

Traced loops are the expensive part of a new graph (tracing, not running),
so each loop structure's functions are made once and reused by every call
and every thread. A long-running server may meet many structures; the
cache keeps the `LoopConfig.loop_cache_size` most recently used entries and
drops the rest (a graph already traced keeps the functions it holds; a
later call of a dropped structure traces it again). `kb.clear_loop_cache()`
drops them all.
"""

import collections
import threading
from typing import Any, Callable, Hashable, Optional

from keras_birnn.config import loop_config


class LoopCache:
    """A least-recently-used map from keys to made values."""

    def __init__(self):
        self._entries: "collections.OrderedDict[Hashable, Any]" = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, make: Callable[[], Any], limit: Optional[int] = None) -> Any:
        """The value for `key`, made by `make()` if absent, keeping at most
        `limit` entries (default: `loop_cache_size` in force). `make` runs
        outside the lock (it may itself read the cache); if two threads
        make the same key at once, both get the value stored first."""
        limit = loop_config().loop_cache_size if limit is None else limit
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key]
        value = make()
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key]
            self._entries[key] = value
            while len(self._entries) > max(limit, 1):
                self._entries.popitem(last=False)
        return value

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


LOOPS = LoopCache()


def clear_loop_cache() -> None:
    """Drops every cached loop function and runner: loops are traced again
    when next called. Graphs already traced keep theirs."""
    LOOPS.clear()


def loop_cache_info() -> dict:
    """`{"entries": n, "limit": m}`: the cache's size and the limit in force
    in this context (`LoopConfig.loop_cache_size`)."""
    return {"entries": len(LOOPS), "limit": loop_config().loop_cache_size}
