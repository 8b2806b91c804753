"""Chat templates: messages -> prompt text through the model's `tokenizer.chat_template` (Jinja).

Templates come from model files, so they are untrusted code. They run in jinja2's
ImmutableSandboxedEnvironment (no attribute starting with an underscore, no mutation of what we pass
in, ranges capped at 100000 items) with the options Hugging Face and llama-cpp-python use
(trim_blocks, lstrip_blocks, loop controls, a `tojson` that keeps non-ASCII text). On top of the
sandbox: any unsafe attribute access fails at once (jinja2 would hand back a silent undefined), `*` and
`**` may not build values past the output bound, calls and filters take no integer argument past it
and format strings no width past it,
the whole render has a time bound checked at every template line, and the output a size bound. Every
failure is a ChatTemplateError naming the cause.

A model without a template gets the plain fallback PLAIN_TEMPLATE: each message as `role: content` on
its own line, then `assistant:` when a generation prompt is asked for. Like the models' own templates,
the fallback writes no BOS: the tokenizer adds it.
"""

from __future__ import annotations

import functools
import json
import re
import sys
import time
from datetime import datetime
from typing import Any, Mapping, Sequence

import jinja2
import jinja2.ext
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import ChatTemplateError

MAX_OUTPUT_CHARS = 1 << 20
MAX_SECONDS = 1.0
PLAIN_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
_TEMPLATE_FILE = "<template>"  # the file name jinja2 gives code compiled from a string


class _Abort(Exception):
    """Stops a render that went past a bound; carries the message for ChatTemplateError."""


def _check_size(n: int, what: str) -> None:
    if n > MAX_OUTPUT_CHARS:
        raise _Abort(f"{what} would exceed the output bound of {MAX_OUTPUT_CHARS} characters")


def _check_args(args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    for a in (*args, *kwargs.values()):
        if isinstance(a, int) and not isinstance(a, bool):
            _check_size(abs(a), f"an argument of {a}")


def _check_format(fmt: str) -> None:
    """Widths and precisions in a format string ('%99999999d', '{:>99999999}') are sizes too; a long
    literal number in a format string is refused with them, a price we accept."""
    for digits in re.findall(r"\d{7,}", fmt):
        _check_size(int(digits), f"a format width of {digits}")


def _bounded(func: Any, name: str) -> Any:
    @functools.wraps(func)  # keeps jinja2's pass_context/pass_environment marks
    def call(*args: Any, **kwargs: Any) -> Any:
        _check_args(args, kwargs)
        if name == "format":
            _check_format(str(next((a for a in args if isinstance(a, str)), "")))
        return func(*args, **kwargs)

    return call


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class _Environment(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**", "%"})

    def __init__(self) -> None:
        super().__init__(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols],
                         autoescape=False)
        self.filters["tojson"] = _tojson
        self.filters = {name: _bounded(f, name) for name, f in self.filters.items()}

    def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
        raise SecurityError(f"access to attribute {attribute!r} of a {type(obj).__name__} object is unsafe")

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "**" and isinstance(right, int) and isinstance(left, (int, float)) and abs(left) > 1:
            _check_size(abs(right) * 64, f"{left} ** {right}")  # digits grow with the exponent
        if operator == "%" and isinstance(left, str):
            _check_format(left)
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int):
                    _check_size(len(seq) * n, "a repeated sequence")
        return super().call_binop(context, operator, left, right)

    def wrap_str_format(self, value: Any) -> Any:
        wrapped = super().wrap_str_format(value)  # the sandboxed str.format / str.format_map, else None
        if wrapped is None:
            return None

        def checked(*args: Any, **kwargs: Any) -> str:
            _check_format(value.__self__)
            return wrapped(*args, **kwargs)

        return checked

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 (jinja2's signature)
        _check_args(args, kwargs)
        return super().call(__context, __obj, *args, **kwargs)


@functools.lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    try:
        return _Environment().from_string(template)
    except TemplateError as e:
        raise ChatTemplateError(f"chat template does not parse: {e}") from None


def _raise_exception(message: str) -> None:
    raise _Abort(f"the template refused the conversation: {message}")


def _check_messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise ChatTemplateError("messages must be a non-empty list of {'role': ..., 'content': ...} objects")
    for k, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ChatTemplateError(f"messages[{k}] must be an object with a string 'role'")
        if not isinstance(m.get("content", ""), (str, list, type(None))):
            raise ChatTemplateError(f"messages[{k}].content must be a string, a list of parts, or null")
    return messages


def render_chat(template: str | None, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True,
                bos_token: str = "", eos_token: str = "", **extra: Any) -> str:
    """The prompt text for `messages` (a list of {"role", "content"} objects) under `template`, or under
    PLAIN_TEMPLATE when it is None. `extra` adds template variables (e.g. tools=...)."""
    compiled = _compile(PLAIN_TEMPLATE if template is None else template)
    context = dict(extra, messages=_check_messages(messages), add_generation_prompt=add_generation_prompt,
                   bos_token=bos_token, eos_token=eos_token, raise_exception=_raise_exception,
                   strftime_now=lambda fmt: datetime.now().strftime(str(fmt)))
    deadline = time.monotonic() + MAX_SECONDS

    def trace(frame: Any, event: str, arg: Any) -> Any:
        if time.monotonic() > deadline:
            raise _Abort(f"rendering took longer than {MAX_SECONDS:g} s")
        return trace if frame.f_code.co_filename == _TEMPLATE_FILE else None

    previous = sys.gettrace()  # a debugger's or coverage's tracer pauses while the template runs
    sys.settrace(trace)
    try:
        parts, size = [], 0
        for chunk in compiled.generate(context):
            size += len(chunk)
            _check_size(size, "the rendered prompt")
            parts.append(chunk)
        return "".join(parts)
    except _Abort as e:
        raise ChatTemplateError(f"chat template stopped: {e}") from None
    except SecurityError as e:
        raise ChatTemplateError(f"chat template tried to leave its sandbox: {e}") from None
    except RecursionError:
        raise ChatTemplateError("chat template recursed without end") from None
    except (TemplateError, OverflowError, ArithmeticError, TypeError, ValueError, LookupError,
            AttributeError, MemoryError) as e:
        raise ChatTemplateError(f"chat template failed: {type(e).__name__}: {e}") from None
    finally:
        sys.settrace(previous)
