"""The OpenAI API as `plan serve` speaks it: request bodies checked field by field (one table per
endpoint) into what the engine runs, and the JSON of answers, stream chunks and errors.

A field OpenAI defines that would change the answer is accepted only at the value we honour (`n` 1,
no penalties, no tools, ...): anything else is a 400 naming it rather than a silently different
result. A field OpenAI does not define is a 400 as well, as OpenAI answers it. JSON null means the
default everywhere."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from .requests import MAX_LOGPROBS, Event, RequestError, SamplingParams, TokenLogprobs

ROLES = ("system", "developer", "user", "assistant", "tool")


class ApiError(Exception):
    """A request answered with OpenAI's error JSON instead of a result."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def _bad(param: str, message: str) -> ApiError:
    return ApiError(400, f"{param}: {message}", param=param)


# --- field checks: each takes (value, field name) and returns the value to use, or raises -----------

Check = Callable[[Any, str], Any]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def integer(lo: int, hi: int | None = None) -> Check:
    def check(v: Any, name: str) -> int:
        if not _is_int(v) or v < lo or (hi is not None and v > hi):
            raise _bad(name, f"must be an integer {f'in {lo}..{hi}' if hi is not None else f'>= {lo}'}, got {v!r}")
        return v
    return check


def number(lo: float, hi: float | None = None, *, lo_open: bool = False, hi_open: bool = False) -> Check:
    span = f"{'(' if lo_open else '['}{lo}, {hi if hi is not None else 'inf'}{')' if hi_open or hi is None else ']'}"

    def check(v: Any, name: str) -> float:
        ok = (isinstance(v, (int, float)) and not isinstance(v, bool) and (v > lo if lo_open else v >= lo)
              and (hi is None or (v < hi if hi_open else v <= hi)))
        if not ok:
            raise _bad(name, f"must be a number in {span}, got {v!r}")
        return float(v)
    return check


def boolean(v: Any, name: str) -> bool:
    if not isinstance(v, bool):
        raise _bad(name, f"must be true or false, got {v!r}")
    return v


def string(v: Any, name: str) -> str:
    if not isinstance(v, str):
        raise _bad(name, f"must be a string, got {type(v).__name__}")
    return v


def only(*allowed: Any, why: str) -> Check:
    """A field accepted at its neutral values only (checked by value and JSON type)."""
    def check(v: Any, name: str) -> Any:
        if not any(v == a and type(v) is type(a) or (isinstance(a, float) and _is_int(v) and v == a) for a in allowed):
            raise _bad(name, f"{v!r} is not supported: {why}")
        return v
    return check


def top_k(v: Any, name: str) -> int:
    return 0 if v == -1 and _is_int(v) else integer(0)(v, name)  # vLLM's -1 also means no limit


def stop(v: Any, name: str) -> tuple[str, ...]:
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise _bad(name, "must be a non-empty string or a list of them")
    return tuple(stops)


def stream_options(v: Any, name: str) -> bool:
    """Whether the stream ends with a usage chunk."""
    if not isinstance(v, dict) or set(v) - {"include_usage"}:
        raise _bad(name, 'must be an object {"include_usage": true|false}')
    return boolean(v.get("include_usage", False), f"{name}.include_usage")


def prompt(v: Any, name: str) -> str | list[int]:
    """One prompt: a text or a list of token ids (a list holding one of those is that one)."""
    if isinstance(v, list) and len(v) == 1 and isinstance(v[0], (str, list)):
        v = v[0]
    if isinstance(v, str):
        return v
    if isinstance(v, list) and v and all(_is_int(t) for t in v):
        return v
    if isinstance(v, list) and len(v) > 1 and all(isinstance(p, (str, list)) for p in v):
        raise _bad(name, f"holds {len(v)} prompts; this server takes one prompt per request")
    raise _bad(name, "must be a string or a non-empty list of token ids")


def messages(v: Any, name: str) -> list[dict[str, str]]:
    """Chat messages as the chat template takes them: role and text (content parts joined)."""
    if not isinstance(v, list) or not v:
        raise _bad(name, "must be a non-empty list of messages")
    out = []
    for i, m in enumerate(v):
        where = f"{name}[{i}]"
        if not isinstance(m, dict):
            raise _bad(where, "must be an object with a role and content")
        extra = set(m) - {"role", "content", "name", "tool_calls", "tool_call_id"}
        if extra:
            raise _bad(f"{where}.{sorted(extra)[0]}", "is not a message field this server takes")
        if m.get("tool_calls"):
            raise _bad(f"{where}.tool_calls", "tool calls are not supported")
        role = m.get("role")
        if role not in ROLES:
            raise _bad(f"{where}.role", f"must be one of {', '.join(ROLES)}, got {role!r}")
        out.append({"role": "system" if role == "developer" else role, "content": _content(m.get("content"), where)}
                   | ({"name": string(m["name"], f"{where}.name")} if m.get("name") is not None else {}))
    return out


def _content(c: Any, where: str) -> str:
    if c is None or isinstance(c, str):
        return c or ""
    if not isinstance(c, list):
        raise _bad(f"{where}.content", "must be a string or a list of text parts")
    texts = []
    for j, part in enumerate(c):
        if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
            raise _bad(f"{where}.content[{j}]", 'only text parts ({"type": "text", "text": ...}) are supported')
        texts.append(part["text"])
    return "\n".join(texts)


REQUIRED = object()
_NO_PENALTIES = "penalties other than repetition_penalty are not implemented"

# Fields both endpoints take: name -> (check, default).
SAMPLING: dict[str, tuple[Check, Any]] = {
    "model": (string, None),  # one model is served: any name reaches it
    "temperature": (number(0), 1.0),
    "top_p": (number(0, 1, lo_open=True), 1.0),
    "top_k": (top_k, 0),
    "min_p": (number(0, 1, hi_open=True), 0.0),
    "repetition_penalty": (number(0, lo_open=True), 1.0),
    "seed": (integer(0), None),
    "stop": (stop, ()),
    "n": (only(1, why="one choice per request"), 1),
    "stream": (boolean, False),
    "stream_options": (stream_options, None),
    "presence_penalty": (only(0.0, why=_NO_PENALTIES), 0.0),
    "frequency_penalty": (only(0.0, why=_NO_PENALTIES), 0.0),
    "logit_bias": (only({}, why="logit_bias is not implemented"), None),
    "user": (string, None),
    "return_token_ids": (boolean, False),  # vLLM's extension: the prompt's and the answer's token ids
}

COMPLETION_FIELDS = SAMPLING | {
    "prompt": (prompt, REQUIRED),
    "max_tokens": (integer(1), 16),  # OpenAI's default for completions
    "logprobs": (integer(0, MAX_LOGPROBS), None),
    "echo": (only(False, why="the prompt is not echoed"), False),
    "suffix": (only("", why="insertion is not supported"), None),
    "best_of": (only(1, why="one candidate per request"), 1),
}

CHAT_FIELDS = SAMPLING | {
    "messages": (messages, REQUIRED),
    "max_tokens": (integer(1), None),
    "max_completion_tokens": (integer(1), None),
    "logprobs": (boolean, False),
    "top_logprobs": (integer(0, MAX_LOGPROBS), None),
    "tools": (only([], why="tools are not supported"), None),
    "tool_choice": (only("none", why="tools are not supported"), None),
    "parallel_tool_calls": (boolean, None),
    "response_format": (only({"type": "text"}, why="only text responses are supported"), None),
}


def _fields(body: dict[str, Any], table: dict[str, tuple[Check, Any]]) -> dict[str, Any]:
    unknown = [k for k in body if k not in table]
    if unknown:
        raise _bad(unknown[0], "unrecognized request argument")
    out = {}
    for name, (check, default) in table.items():
        v = body.get(name)
        if v is None:
            if default is REQUIRED:
                raise _bad(name, "is required")
            out[name] = default
        else:
            out[name] = check(v, name)
    return out


@dataclass
class Ask:
    """A checked request: what the engine runs (prompt or messages to render, limits, sampling) and
    how the answer is written."""

    chat: bool
    prompt: str | list[int] | list[dict[str, str]]  # text or ids (completions), messages (chat)
    max_tokens: int | None  # None: up to the context
    params: SamplingParams
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    logprobs: int | None  # top alternatives per token; None: no logprobs
    token_ids: bool


def parse_completion(body: dict[str, Any]) -> Ask:
    f = _fields(body, COMPLETION_FIELDS)
    return _ask(f, False, f["prompt"], f["max_tokens"], f["logprobs"])


def parse_chat(body: dict[str, Any]) -> Ask:
    f = _fields(body, CHAT_FIELDS)
    if f["top_logprobs"] is not None and not f["logprobs"]:
        raise _bad("top_logprobs", "needs logprobs: true")
    top = (f["top_logprobs"] or 0) if f["logprobs"] else None
    return _ask(f, True, f["messages"], f["max_completion_tokens"] or f["max_tokens"], top)


def _ask(f: dict[str, Any], chat: bool, what: Any, max_tokens: int | None, logprobs: int | None) -> Ask:
    if f["stream_options"] is not None and not f["stream"]:
        raise _bad("stream_options", "is only allowed with stream: true")
    try:
        params = SamplingParams(f["temperature"], f["top_k"], f["top_p"], f["min_p"], f["repetition_penalty"],
                                f["seed"])
    except RequestError as e:
        raise ApiError(400, str(e)) from None
    return Ask(chat, what, max_tokens, params, f["stop"], f["stream"], bool(f["stream_options"]), logprobs,
               f["return_token_ids"])


# --- answers -----------------------------------------------------------------------------------------

def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


class Reply:
    """The JSON of one request's answer, whole or as stream chunks, in OpenAI's shapes for completions
    ("text_completion") or chat ("chat.completion", chunks "chat.completion.chunk")."""

    def __init__(self, ask: Ask, model: str, piece: Callable[[int], bytes]):
        self.ask, self.model, self.piece = ask, model, piece
        self.id = f"{'chatcmpl' if ask.chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self._offset = 0  # completions' logprobs.text_offset runs over the whole answer

    def _envelope(self, chunk: bool) -> dict[str, Any]:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.ask.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def whole(self, text: str, events: list[Event], finish: str, prompt_ids: list[int], ids: list[int]) -> dict:
        choice: dict[str, Any] = {"index": 0}
        if self.ask.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        choice["logprobs"] = self._logprobs(events)
        choice["finish_reason"] = finish
        if self.ask.token_ids:
            choice |= {"prompt_token_ids": prompt_ids, "token_ids": ids}
        return self._envelope(False) | {"choices": [choice], "usage": usage(len(prompt_ids), len(ids))}

    def chunk(self, text: str, events: list[Event], finish: str | None = None, first: bool = False) -> dict:
        choice: dict[str, Any] = {"index": 0}
        if self.ask.chat:
            choice["delta"] = ({"role": "assistant"} if first else {}) | ({"content": text} if text or first else {})
        else:
            choice["text"] = text
        choice["logprobs"] = self._logprobs(events)
        choice["finish_reason"] = finish
        if self.ask.token_ids:
            choice["token_ids"] = [e.token for e in events if e.token is not None]
        return self._envelope(True) | {"choices": [choice]} | ({"usage": None} if self.ask.include_usage else {})

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> dict:
        return self._envelope(True) | {"choices": [], "usage": usage(prompt_tokens, completion_tokens)}

    def _logprobs(self, events: list[Event]) -> dict[str, Any] | None:
        if self.ask.logprobs is None:
            return None
        got = [(e.token, e.logprobs) for e in events if e.logprobs is not None]
        if self.ask.chat:
            return {"content": [self._chat_entry(t, lp) for t, lp in got]}
        out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for t, lp in got:
            s = self._text(t)
            out["tokens"].append(s)
            out["token_logprobs"].append(lp.logprob)
            out["top_logprobs"].append({self._text(a): v for a, v in lp.top})
            out["text_offset"].append(self._offset)
            self._offset += len(s)
        return out

    def _chat_entry(self, token: int, lp: TokenLogprobs) -> dict[str, Any]:
        one = lambda t, v: {"token": self._text(t), "logprob": v, "bytes": list(self.piece(t))}  # noqa: E731
        return one(token, lp.logprob) | {"top_logprobs": [one(a, v) for a, v in lp.top]}

    def _text(self, token: int) -> str:
        return self.piece(token).decode("utf-8", errors="replace")
