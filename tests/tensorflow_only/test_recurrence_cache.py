"""The loop cache (`keras_birnn.recurrence.cache`): least recently used
entries go first once the limit is reached, and threads asking for one key
at once all get the value stored first."""

import threading

from keras_birnn.recurrence.cache import LoopCache


def test_least_recently_used_entries_go_first():
    cache, made = LoopCache(), []

    def get(key):
        return cache.get(key, lambda: made.append(key) or f"value {key}", limit=3)

    assert [get(k) for k in "abc"] == ["value a", "value b", "value c"]
    get("a")  # now b is the least recently used
    get("d")
    assert len(cache) == 3
    get("a"), get("c"), get("d")
    assert made == ["a", "b", "c", "d"]  # a, c and d were kept
    get("b")
    assert made == ["a", "b", "c", "d", "b"] and len(cache) == 3
    cache.clear()
    assert len(cache) == 0


def test_threads_asking_at_once_share_one_value():
    cache, barrier, got = LoopCache(), threading.Barrier(8), []

    def work():
        barrier.wait(timeout=10)
        got.append(cache.get("key", object, limit=4))

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 8 and all(g is got[0] for g in got)
    assert len(cache) == 1
