"""The chat page `plan serve` shows at / (runtime/chat.html: one file of HTML, CSS and JavaScript, no
build step and nothing fetched from elsewhere), read once from the package."""

from __future__ import annotations

from functools import cache
from importlib import resources


@cache
def chat_page() -> bytes:
    return resources.files("llmplan.runtime").joinpath("chat.html").read_bytes()
