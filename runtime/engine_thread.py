"""The one thread that drives the engine for `plan serve` (the engine is not thread-safe).

HTTP handlers, on the server's event loop, hand it requests and cancellations through a thread-safe
inbox; it takes everything there before each step, so a request that arrives mid-generation joins
the next batched step (continuous batching), and a cancellation releases the request's K/V blocks
before the next step runs. Each request's events go back to its handler's event loop through the
request's Stream. The thread blocks on the inbox while the engine is idle."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from .engine import Engine
from .requests import Event, Request, RequestError
from .serve_metrics import Metrics

log = logging.getLogger("uvicorn.error")


@dataclass
class Accepted:
    """A Stream's first item when the engine took the request."""

    request_id: int


@dataclass
class EngineStopped:
    """A Stream's item when the engine thread has stopped: on an error (a bug, HTTP 500) or because
    the server is shutting down (503)."""

    status: int
    message: str


SHUTTING_DOWN = EngineStopped(503, "the server is shutting down")


class Stream:
    """One request's hand-over between its handler's event loop and the engine thread: the engine
    thread puts (Accepted or a RequestError, then Events to the finish; EngineStopped if it stops
    first), the handler gets."""

    def __init__(self, request: Request):
        self.request = request
        self.arrived = time.perf_counter()
        self.request_id: int | None = None
        self.tokens = 0
        self.last = 0.0
        self._loop = asyncio.get_running_loop()
        self._items: asyncio.Queue[Any] = asyncio.Queue()

    def put(self, item: Any) -> None:  # engine thread
        try:
            self._loop.call_soon_threadsafe(self._items.put_nowait, item)
        except RuntimeError:  # the event loop has closed: nobody is listening any more
            pass

    async def get(self) -> Any:
        return await self._items.get()

    async def get_all(self) -> list[Any]:
        """What has arrived (waiting for the first item if none has)."""
        out = [await self._items.get()]
        while not self._items.empty():
            out.append(self._items.get_nowait())
        return out


class EngineThread:
    def __init__(self, load: Callable[[], Engine], metrics: Metrics,
                 on_ready: Callable[[Engine], None] = lambda e: None, on_failure: Callable[[BaseException], None] =
                 lambda e: None):
        self._load, self.metrics, self._on_ready, self._on_failure = load, metrics, on_ready, on_failure
        self.engine: Engine | None = None
        self.failure: BaseException | None = None
        self._inbox: queue.SimpleQueue[tuple[str, Stream | None]] = queue.SimpleQueue()
        self._live: dict[int, Stream] = {}
        self._stopped: EngineStopped | None = None  # set once the thread takes no more requests
        self._lock = threading.Lock()  # makes a submission and the thread's stopping one before the other
        self._thread = threading.Thread(target=self._main, name="engine", daemon=True)

    @property
    def ready(self) -> bool:
        return self.engine is not None and self.failure is None

    def start(self) -> None:
        self._thread.start()

    def submit(self, stream: Stream) -> None:
        with self._lock:
            if self._stopped is None:
                self._inbox.put(("submit", stream))
                return
        stream.put(self._stopped)

    def cancel(self, stream: Stream) -> None:
        self._inbox.put(("cancel", stream))

    def stop(self, timeout: float | None = None) -> None:
        """Cancel what is left, and end the thread once the engine is idle."""
        if self._thread.is_alive():
            self._inbox.put(("stop", None))
            self._thread.join(timeout)

    # --- the thread ----------------------------------------------------------------------------------

    def _main(self) -> None:
        try:
            engine = self._load()
        except BaseException as e:  # noqa: BLE001 (reported to the server, which exits)
            self.failure = e
            self._on_failure(e)
            return
        self._on_ready(engine)
        self.engine = engine
        self._gauges()
        try:
            self._serve(engine)
        except BaseException as e:  # noqa: BLE001 (a bug: every request in flight hears of it)
            log.exception("the engine thread stopped")
            self.failure = e
            self._stop(EngineStopped(500, f"the engine stopped: {type(e).__name__}: {e}"))
            self._on_failure(e)
        else:
            self._stop(SHUTTING_DOWN)

    def _stop(self, why: EngineStopped) -> None:
        """Tell every request still in flight, or still in the inbox, that no answer is coming."""
        with self._lock:
            self._stopped = why
        for stream in self._live.values():
            stream.put(why)
        while True:
            try:
                what, stream = self._inbox.get_nowait()
            except queue.Empty:
                return
            if what == "submit":
                stream.put(why)

    def _serve(self, engine: Engine) -> None:
        stopping = False
        while not (stopping and engine.idle):
            block = engine.idle and not stopping
            while True:
                try:
                    what, stream = self._inbox.get(block=block)
                except queue.Empty:
                    break
                block = False
                if what == "submit" and stopping:
                    stream.put(SHUTTING_DOWN)
                elif what == "submit":
                    self._submit(engine, stream)
                elif what == "cancel" and stream.request_id in self._live:
                    engine.cancel(stream.request_id)
                elif what == "stop":
                    stopping = True
                    for sid in list(self._live):
                        engine.cancel(sid)
            self._gauges()  # a step can take long: show what the inbox changed now
            if not engine.idle:
                self._deliver(engine.step())
                self.metrics.preemptions.inc(len(engine.records[-1]["preempted"]))
            self._gauges()

    def _submit(self, engine: Engine, stream: Stream) -> None:
        try:
            sid = engine.submit(stream.request)
        except RequestError as e:
            stream.put(e)
            return
        stream.request_id = sid
        self._live[sid] = stream
        stream.put(Accepted(sid))

    def _deliver(self, events: list[Event]) -> None:
        now = time.perf_counter()
        m = self.metrics
        for ev in events:
            stream = self._live.get(ev.request)
            if stream is None:
                continue
            if ev.token is not None:
                if stream.tokens == 0:
                    m.ttft.observe(now - stream.arrived)
                    m.prompt_tokens.inc(len(stream.request.prompt))
                else:
                    m.tpot.observe(now - stream.last)
                stream.tokens += 1
                stream.last = now
                m.generated_tokens.inc()
            if ev.finish_reason:
                del self._live[ev.request]
                m.finished.labels(ev.finish_reason).inc()
            stream.put(ev)

    def _gauges(self) -> None:
        e, m = self.engine, self.metrics
        m.running.set(len(e.scheduler.running))
        m.waiting.set(len(e.scheduler.waiting))
        m.kv_free.set(e.pool.free_blocks)
        m.kv_used.set(e.pool.total - e.pool.free_blocks)
