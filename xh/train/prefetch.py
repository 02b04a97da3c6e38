"""Batches made ahead of the training step, so that the step never waits on the tokenizer.

    with GraphEncoder(tokenizer, max_node_tokens=512, processes=4) as encoder, Prefetcher(
        (pack(graphs, row_tokens=512, row_multiple=2) for graphs in encoder.map(chunks_of_rows)),
        depth=2, pin_memory=device.type == "cuda",
    ) as batches:
        for batch in batches:                                # ready: encoded, packed and pinned
            batch = batch.to(device, non_blocking=True)      # an asynchronous copy from pinned memory
            ...
    batches.wait_seconds                                     # time the step loop spent waiting for a batch

    seconds = {}                                             # where the background thread's time goes:
    rows = timed(chunks_of_rows, seconds, "data")            # each `next` timed, what feeds it included
    batches = timed(layout.batches(timed(encoder.map(rows), seconds, "encoded")), seconds, "batched")

`Prefetcher` runs any iterator in a background thread and keeps up to `depth` finished items in a
queue; the chain it runs (reading rows, `xh.graph.encode.GraphEncoder`, `xh.model.packing`,
pinning) is lazy, so it all happens in that thread, or in the encoder's worker processes, while the
training step runs. An exception in the chain reaches the consumer at the item where it happened;
`close()` (or leaving the `with`) stops the thread when the consumer stops early.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")

_DONE = object()


def timed(items: Iterable[T], seconds: dict[str, float], key: str) -> Iterator[T]:
    """`items`, adding to `seconds[key]` the time each took to arrive. Timers on a chain nest: an outer
    one's time includes the inner ones' (the difference is the outer step's own)."""
    items = iter(items)
    seconds.setdefault(key, 0.0)
    while True:
        start = time.perf_counter()
        item = next(items, _DONE)
        seconds[key] += time.perf_counter() - start
        if item is _DONE:
            return
        yield item


class _Failure:
    def __init__(self, error: BaseException):
        self.error = error


class Prefetcher(Generic[T]):
    def __init__(self, items: Iterable[T], depth: int = 2, pin_memory: bool = False):
        self.wait_seconds = 0.0  # consumer time spent in __next__ waiting for the queue
        self.count = 0
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._finished = False
        self._pin_memory = pin_memory
        self._thread = threading.Thread(target=self._produce, args=(iter(items),), name="xh-prefetch", daemon=True)
        self._thread.start()

    def _produce(self, items: Iterator[T]) -> None:
        try:
            for item in items:
                if self._pin_memory:  # page-locked: the copy to the GPU can then run asynchronously
                    item = item.pin_memory()
                if not self._put(item):
                    return
            self._put(_DONE)
        except BaseException as error:  # noqa: BLE001  (handed to the consumer, raised there)
            self._put(_Failure(error))

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> Prefetcher[T]:
        return self

    def __next__(self) -> T:
        if self._finished:
            raise StopIteration
        start = time.perf_counter()
        item = self._queue.get()
        self.wait_seconds += time.perf_counter() - start
        if item is _DONE or isinstance(item, _Failure):
            self._finished = True
            if item is _DONE:
                raise StopIteration
            raise item.error
        self.count += 1
        return item

    def close(self) -> None:
        self._stop.set()
        self._finished = True
        self._thread.join()

    def __enter__(self) -> Prefetcher[T]:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
