"""A Chrome trace-event recording of a run (`plan run --trace out.json`; Perfetto and chrome://tracing
open it): load phases, engine steps with their scheduling, prefill chunks and decode steps, each
kernel launch (host issue time), graph recordings and replays, on a "host" track; on drivers with a
device clock (cuda, hip) the launches and replays again on a "device" track, timed by events; the
token masks of constrained requests, computed beside a step's launches, on a "masks" track.

Spans are complete events ("ph": "X") in microseconds since the trace began; a span closes after
everything it encloses, so spans on one track nest. Device times are placed by an anchor: a marker
recorded on an idle stream when the driver is attached, taken to be the host time it completed.
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager, nullcontext
from typing import Any, Iterator

HOST, DEVICE, MASKS = 1, 2, 3  # the tracks (trace-event thread ids); MASKS: constrained requests' token masks


class Trace:
    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.events: list[dict[str, Any]] = []
        self.driver: Any = None
        self.anchor: tuple[Any, float] | None = None  # (device marker, host seconds it stands for)
        self.device: list[tuple[str, str, Any, Any, dict]] = []  # (name, cat, start and end markers, args)

    def _us(self, t: float) -> float:
        return round((t - self.t0) * 1e6, 3)

    def complete(self, name: str, cat: str, start: float, end: float, tid: int = HOST, **args: Any) -> None:
        self.events.append({"name": name, "cat": cat, "ph": "X", "ts": self._us(start),
                            "dur": round(max(end - start, 0.0) * 1e6, 3), "pid": 1, "tid": tid, "args": args})

    @contextmanager
    def span(self, name: str, cat: str, **args: Any) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.complete(name, cat, start, time.perf_counter(), **args)

    def attach(self, driver: Any) -> None:
        """Time device work on this driver's clock, where it has one."""
        self.driver = driver
        mark = driver.marker()
        if mark is not None:
            driver.sync()
            self.anchor = (mark, time.perf_counter())

    @contextmanager
    def on_device(self, name: str, cat: str, **args: Any) -> Iterator[None]:
        """A host span around queuing device work, and that work's device time."""
        first = self.driver.marker() if self.anchor else None
        with self.span(name, cat, **args):
            yield
        if first is not None:
            self.device.append((name, cat, first, self.driver.marker(), args))

    def write(self, path: str) -> None:
        if self.anchor is not None:
            mark, host = self.anchor
            for name, cat, first, last, args in self.device:
                start = host + first.seconds_since(mark)
                self.complete(name, cat, start, start + last.seconds_since(first), DEVICE, **args)
            self.device = []
        names = [{"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": name}}
                 for tid, name in ((HOST, "host"), (DEVICE, "device"), (MASKS, "masks"))]
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"traceEvents": names + self.events, "displayTimeUnit": "ms"}, f)


def span(trace: Trace | None, name: str, cat: str, **args: Any):
    """trace.span(...), or nothing when not tracing."""
    return nullcontext() if trace is None else trace.span(name, cat, **args)
