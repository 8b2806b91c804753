"""`plan serve`: an OpenAI-compatible HTTP API over the engine, on Starlette served by uvicorn.

Handlers run on uvicorn's event loop and never touch the engine: they check a request
(runtime/openai_api.py), tokenize it in a worker thread, and hand it to the one engine thread
(runtime/engine_thread.py), whose batched steps every request in flight shares. A streamed answer
is server-sent events in OpenAI's chunk format ending in `data: [DONE]`; a client that goes away,
streaming or not, has its request cancelled at once, which releases its K/V blocks. Past the
running requests at most `queue` wait; more are answered 429. SIGINT or SIGTERM stops accepting,
lets what runs finish for `grace` seconds, cancels the rest, and returns."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import os
import signal
import socket
import sys
import threading
import time
from typing import Any, AsyncIterator, Awaitable, Callable, TypeVar

import anyio
import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from llmplan.core.errors import InputError

from .engine import Engine
from .engine_thread import EngineStopped, EngineThread, Stream
from .openai_api import ApiError, Ask, Reply, parse_chat, parse_completion
from .requests import Event, Request, RequestError
from .serve_metrics import CONTENT_TYPE, Metrics

T = TypeVar("T")

DEFAULT_QUEUE = 64
DEFAULT_MAX_BODY = 4 << 20
DEFAULT_GRACE = 30.0


class _Service:
    """The endpoints and what they share: the engine thread, the metrics, the count of requests in flight."""

    def __init__(self, load: Callable[[], Engine], name: str | None, api_key: str | None, queue: int,
                 max_body: int, on_failure: Callable[[BaseException], None]):
        self.name, self.queue, self.max_body = name, queue, max_body
        self._key = api_key.encode() if api_key else None
        self.metrics = Metrics()
        self.engine = EngineThread(load, self.metrics, self._ready, on_failure)
        self.in_flight = 0  # handlers run on one event loop: a plain count is safe
        self.created = 0

    def _ready(self, engine: Engine) -> None:
        self.name = self.name or os.path.splitext(os.path.basename(engine.model.path))[0]
        self.created = int(time.time())
        _say(f"ready: model {self.name}, context {engine.limits.ctx}, {engine.scheduler.max_seqs} sequences per "
             f"step, {engine.pool.total} K/V blocks (loaded in {engine.load_seconds:.2f} s)")

    # --- what every guarded endpoint checks ---------------------------------------------------------

    def _guard(self, request: HttpRequest) -> Engine:
        if self._key is not None:
            got = request.headers.get("authorization", "")
            scheme, _, token = got.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self._key):
                raise ApiError(401, "a valid API key is required: send Authorization: Bearer KEY",
                               "authentication_error", code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
        if not self.engine.ready:
            what = "stopped on an error" if self.engine.failure else "is still loading"
            raise ApiError(503, f"the model {what}", "server_error", code="model_not_ready", headers={"Retry-After": "1"})
        return self.engine.engine

    async def _body(self, request: HttpRequest) -> dict[str, Any]:
        """The JSON object of a request's body, at most max_body bytes."""
        too_big = ApiError(413, f"the request body is larger than {self.max_body} bytes", code="request_too_large")
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > self.max_body:
            raise too_big
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > self.max_body:
                raise too_big
        try:
            body = json.loads(bytes(raw), parse_constant=_no_constant)
        except (ValueError, RecursionError) as e:
            raise ApiError(400, f"the body is not valid JSON: {e}", code="invalid_json") from None
        if not isinstance(body, dict):
            raise ApiError(400, f"the body must be a JSON object, got {type(body).__name__}", code="invalid_json")
        return body

    # --- endpoints ---------------------------------------------------------------------------------

    async def health(self, request: HttpRequest) -> Response:
        if self.engine.ready:
            return JSONResponse({"status": "ok"})
        status = "error" if self.engine.failure else "loading"
        return JSONResponse({"status": status}, status_code=503, headers={"Retry-After": "1"})

    async def metrics_text(self, request: HttpRequest) -> Response:
        return Response(self.metrics.text(), media_type=CONTENT_TYPE)

    async def models(self, request: HttpRequest) -> Response:
        engine = self._guard(request)
        return JSONResponse({"object": "list", "data": [
            {"id": self.name, "object": "model", "created": self.created,
             "owned_by": "llmplan", "max_model_len": engine.limits.ctx}]})

    async def tokenize(self, request: HttpRequest) -> Response:
        """vLLM's /tokenize: {"prompt": TEXT, "add_special_tokens": true} or {"messages": [...]}."""
        engine = self._guard(request)
        body = await self._body(request)
        unknown = set(body) - {"model", "prompt", "messages", "add_special_tokens"}
        if unknown:
            raise ApiError(400, f"{sorted(unknown)[0]}: unrecognized request argument", param=sorted(unknown)[0])
        special = body.get("add_special_tokens", True)
        if not isinstance(special, bool):
            raise ApiError(400, "add_special_tokens: must be true or false", param="add_special_tokens")
        if ("prompt" in body) == ("messages" in body):
            raise ApiError(400, "give either prompt (a string) or messages", param="prompt")
        if "messages" in body:
            ask = parse_chat({"messages": body["messages"]})
            ids = await self._ids(engine, ask)
        elif isinstance(body["prompt"], str):
            ids = await self._encode(engine.tokenizer.encode, body["prompt"], add_special=special, parse_special=True)
        else:
            raise ApiError(400, "prompt: must be a string", param="prompt")
        return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": engine.limits.ctx})

    async def detokenize(self, request: HttpRequest) -> Response:
        """vLLM's /detokenize: {"tokens": [ids]} -> {"prompt": TEXT}."""
        engine = self._guard(request)
        body = await self._body(request)
        unknown = set(body) - {"model", "tokens"}
        if unknown:
            raise ApiError(400, f"{sorted(unknown)[0]}: unrecognized request argument", param=sorted(unknown)[0])
        ids = body.get("tokens")
        n = engine.tokenizer.n_tokens
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < n
                                                for t in ids):
            raise ApiError(400, f"tokens: must be a list of token ids in 0..{n - 1}", param="tokens")
        return JSONResponse({"prompt": engine.tokenizer.decode(ids)})

    async def completions(self, request: HttpRequest) -> Response:
        engine = self._guard(request)
        return await self._generate(request, engine, parse_completion(await self._body(request)))

    async def chat(self, request: HttpRequest) -> Response:
        engine = self._guard(request)
        return await self._generate(request, engine, parse_chat(await self._body(request)))

    # --- generation ----------------------------------------------------------------------------------

    async def _encode(self, fn: Callable[..., list[int]], what: Any, **kw: Any) -> list[int]:
        try:
            return await run_in_threadpool(fn, what, **kw)  # templates and long prompts: off the event loop
        except InputError as e:
            raise ApiError(400, str(e), param="prompt" if isinstance(what, str) else "messages") from None

    async def _ids(self, engine: Engine, ask: Ask) -> list[int]:
        """The prompt's token ids: the chat template's rendering, or the text's ids (BOS added, special
        tokens parsed, as the engine encodes a text prompt)."""
        if ask.chat:
            return await self._encode(engine.tokenizer.encode_chat, ask.prompt)
        if isinstance(ask.prompt, str):
            return await self._encode(engine.tokenizer.encode, ask.prompt, add_special=True, parse_special=True)
        return ask.prompt

    async def _generate(self, http: HttpRequest, engine: Engine, ask: Ask) -> Response:
        if self.in_flight >= engine.scheduler.max_seqs + self.queue:
            self.metrics.rejected.inc()
            raise ApiError(429, f"the server is busy: {self.in_flight} requests in flight; retry shortly",
                           "rate_limit_error", code="queue_full", headers={"Retry-After": "1"})
        job = _Job(self)
        streaming = False
        try:
            ids = await self._ids(engine, ask)
            ctx = engine.limits.ctx
            if len(ids) >= ctx:
                raise ApiError(400, f"the prompt has {len(ids)} tokens; this model's context holds {ctx} "
                                    f"(prompt and completion): shorten the prompt",
                               param="messages" if ask.chat else "prompt", code="context_length_exceeded")
            await job.submit(Request(ids, ask.max_tokens or ctx, ask.params, ask.stop, logprobs=ask.logprobs),
                             "messages" if ask.chat else "prompt")
            reply = Reply(ask, self.name, engine.tokenizer.piece)
            if ask.stream:
                streaming = True
                return _EventStream(_chunks(job, reply), job.close)
            events = await _unless_disconnected(http, job.rest())
            if events is None:
                return Response(status_code=499)  # nobody reads it: the client has gone
            end = events[-1]
            if end.finish_reason == "error":
                raise ApiError(400, end.result.error, param="messages" if ask.chat else "prompt")
            return JSONResponse(reply.whole(end.result.text, events, end.finish_reason, end.result.prompt_ids,
                                            end.result.ids))
        finally:
            if not streaming:  # a stream closes its job when it ends
                job.close()


class _Job:
    """One request in flight, holding its place in the queue from its creation until close(), which
    cancels it in the engine unless it has finished."""

    def __init__(self, service: _Service):
        self.service = service
        self.stream: Stream | None = None
        self.finished = self._closed = False
        service.in_flight += 1

    async def submit(self, request: Request, param: str) -> None:
        """Hand the request to the engine thread; raises ApiError if the engine refuses it."""
        self.stream = Stream(request)
        self.service.engine.submit(self.stream)
        first = await self.stream.get()
        if isinstance(first, RequestError):
            self.finished = True
            raise ApiError(400, str(first), param=param)
        _raise_failure(first)

    async def events(self) -> AsyncIterator[list[Event]]:
        """The events that have arrived, a batch at a time, to the finish."""
        while not self.finished:
            batch = await self.stream.get_all()
            for item in batch:
                _raise_failure(item)
            self.finished = any(e.finish_reason for e in batch)
            yield batch

    async def rest(self) -> list[Event]:
        return [e async for batch in self.events() for e in batch]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.service.in_flight -= 1
        if self.stream is not None and not self.finished:
            self.service.engine.cancel(self.stream)


def _raise_failure(item: Any) -> None:
    if isinstance(item, EngineStopped):
        raise ApiError(item.status, item.message, "server_error")


async def _chunks(job: _Job, reply: Reply) -> AsyncIterator[bytes]:
    """A request's answer as server-sent events: a chunk per batch of events that says something."""
    ask = reply.ask
    if ask.chat:
        yield _sse(reply.chunk("", [], first=True))  # OpenAI's first chat chunk: the role
    try:
        async for batch in job.events():
            end = batch[-1] if batch[-1].finish_reason else None
            if end is not None and end.finish_reason == "error":
                yield _sse(ApiError(400, end.result.error).body())
                break
            text = "".join(e.text for e in batch)
            tokens = any(e.token is not None for e in batch)
            if text or end is not None or (tokens and (ask.logprobs is not None or ask.token_ids)):
                yield _sse(reply.chunk(text, batch, end.finish_reason if end is not None else None))
            if end is not None and ask.include_usage:
                yield _sse(reply.usage_chunk(len(end.result.prompt_ids), len(end.result.ids)))
    except ApiError as e:  # the engine stopped: the status line is sent, so the error goes in the stream
        yield _sse(e.body())
    yield b"data: [DONE]\n\n"


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


class _EventStream(StreamingResponse):
    """Server-sent events whose request is cancelled the moment the client disconnects: Starlette's
    StreamingResponse, under ASGI 2.4, only notices at its next send."""

    def __init__(self, chunks: AsyncIterator[bytes], on_close: Callable[[], None]):
        super().__init__(chunks, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self._on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            async with anyio.create_task_group() as tg:
                async def pump() -> None:
                    with contextlib.suppress(OSError):  # the client went while we were sending
                        await self.stream_response(send)
                    tg.cancel_scope.cancel()

                tg.start_soon(pump)
                await self.listen_for_disconnect(receive)
                tg.cancel_scope.cancel()
        finally:
            self._on_close()


async def _unless_disconnected(http: HttpRequest, work: Awaitable[T]) -> T | None:
    """`work`'s result, or None if the client disconnects first (work is then cancelled)."""
    async def gone() -> None:
        while (await http.receive())["type"] != "http.disconnect":
            pass

    tasks = [asyncio.ensure_future(work), asyncio.ensure_future(gone())]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        return tasks[0].result() if tasks[0] in done else None
    finally:
        for t in tasks:
            t.cancel()


def _say(line: str) -> None:
    """The server's own lines on stderr, whatever uvicorn's log level."""
    print(f"plan serve: {line}", file=sys.stderr, flush=True)


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


# --- errors as OpenAI's JSON -------------------------------------------------------------------------

async def _api_error(request: HttpRequest, e: ApiError) -> Response:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


async def _http_error(request: HttpRequest, e: HTTPException) -> Response:
    kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
    err = ApiError(e.status_code, f"{request.method} {request.url.path}: {e.detail}", kind, headers=e.headers)
    return await _api_error(request, err)


async def _server_error(request: HttpRequest, e: Exception) -> Response:
    return await _api_error(request, ApiError(500, f"internal error: {type(e).__name__}: {e}", "server_error"))


def create_app(load: Callable[[], Engine], *, name: str | None = None, api_key: str | None = None,
               queue: int = DEFAULT_QUEUE, max_body: int = DEFAULT_MAX_BODY,
               on_failure: Callable[[BaseException], None] = lambda e: None) -> Starlette:
    """The ASGI app. `load` builds the engine, on the engine thread, when the app starts (until it
    returns /health says 503); `on_failure` hears if loading or the engine thread fails."""
    service = _Service(load, name, api_key, queue, max_body, on_failure)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        service.engine.start()
        yield
        await run_in_threadpool(service.engine.stop)

    s = service
    routes = [Route("/health", s.health), Route("/metrics", s.metrics_text), Route("/v1/models", s.models),
              Route("/v1/completions", s.completions, methods=["POST"]),
              Route("/v1/chat/completions", s.chat, methods=["POST"]),
              Route("/tokenize", s.tokenize, methods=["POST"]), Route("/detokenize", s.detokenize, methods=["POST"])]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={ApiError: _api_error, HTTPException: _http_error, Exception: _server_error})
    app.state.service = service
    return app


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self):  # type: ignore[override]
        """uvicorn's, less raising the signal again once shut down: a server stopped by a signal exits 0."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        old = {s: signal.signal(s, self.handle_exit) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, h in old.items():
                signal.signal(s, h)


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: any free one)."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(2048)
    except OSError as e:
        raise InputError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


def serve(load: Callable[[], Engine], *, host: str = "127.0.0.1", port: int = 8000, name: str | None = None,
          api_key: str | None = None, queue: int = DEFAULT_QUEUE, max_body: int = DEFAULT_MAX_BODY,
          grace: float = DEFAULT_GRACE, log_level: str = "info") -> None:
    """Serve until SIGINT or SIGTERM. Raises what loading the engine raised, if it failed."""
    failed: list[BaseException] = []

    def on_failure(e: BaseException) -> None:
        failed.append(e)
        server.should_exit = True

    app = create_app(load, name=name, api_key=api_key, queue=queue, max_body=max_body, on_failure=on_failure)
    config = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=grace, lifespan="on")
    server = _Server(config)
    sock = listen(host, port)
    bound = sock.getsockname()
    _say(f"listening on http://{f'[{bound[0]}]' if ':' in bound[0] else bound[0]}:{bound[1]}")
    try:
        asyncio.run(server.serve(sockets=[sock]))
    finally:
        sock.close()
    if failed:
        raise failed[0]
