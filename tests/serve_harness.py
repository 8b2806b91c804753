"""`plan serve` in a subprocess on a free loopback port, for the serve tests: started through the real
command line, driven over real HTTP."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

try:
    import httpx
    import openai  # noqa: F401 (the tests' client)
    import starlette  # noqa: F401 (the server's)
    from prometheus_client.parser import text_string_to_metric_families
except ImportError as e:  # a checkout without the extras: CI installs them (.[dev,serve]) and must not skip
    if os.environ.get("CI"):
        raise
    pytest.skip(f"the serve tests need pip install -e '.[dev,serve]' ({e.name} is missing)", allow_module_level=True)

START_S = 60.0


class Served:
    def __init__(self, plan: str, log: Path, *flags: str, env: dict[str, str] | None = None):
        self.log = log
        env = os.environ | {"LLMPLAN_TUNE_DIR": "off", "PYTHONUNBUFFERED": "1"} | (env or {})
        self._out = open(log, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "llmplan.commands.cli", "serve", plan, "--port", "0",
                                      *flags], stdout=self._out, stderr=subprocess.STDOUT, env=env)
        self.url = self._wait_for(r"listening on (http://\S+)")
        self.headers = {"Authorization": f"Bearer {flags[flags.index('--api-key') + 1]}"} if "--api-key" in flags \
            else {}
        self.http = httpx.Client(base_url=self.url, timeout=60, headers=self.headers)
        deadline = time.monotonic() + START_S
        while not self._healthy():
            self._check_alive()
            if time.monotonic() > deadline:
                raise AssertionError(f"plan serve did not become healthy:\n{self.output()}")
            time.sleep(0.05)

    def _healthy(self) -> bool:
        try:
            return self.http.get("/health").status_code == 200
        except httpx.TransportError:  # the server is not listening (yet, or any more)
            return False

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def _check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise AssertionError(f"plan serve exited with {self.proc.returncode}:\n{self.output()}")

    def _wait_for(self, pattern: str) -> str:
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            m = re.search(pattern, self.output())
            if m:
                return m.group(1)
            self._check_alive()
            time.sleep(0.05)
        raise AssertionError(f"plan serve printed no {pattern!r}:\n{self.output()}")

    def post(self, path: str, body: dict, **kw) -> httpx.Response:
        return self.http.post(path, json=body, **kw)

    def metrics(self) -> dict[str, float]:
        """Every sample of /metrics: 'name{label="v"}' (or the bare name) -> value."""
        text = self.http.get("/metrics").text
        out = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
                out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
        return out

    def wait_for(self, what, timeout: float = 10.0) -> dict[str, float]:
        """The metrics once what(metrics) holds (fails after `timeout` seconds)."""
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            if what(m):
                return m
            if time.monotonic() > deadline:
                raise AssertionError(f"still not so after {timeout} s: {m}")
            time.sleep(0.02)

    def wait_idle(self, timeout: float = 10.0) -> dict[str, float]:
        """The metrics once nothing runs, waits or holds a K/V block."""
        return self.wait_for(lambda m: m["llmplan_requests_running"] == m["llmplan_requests_waiting"]
                             == m["llmplan_kv_blocks_used"] == 0, timeout)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        self.http.close()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._out.close()


def sse_events(lines):
    """The data of a server-sent event stream as it arrives: JSON objects, then the final '[DONE]'."""
    for line in lines:
        if line.startswith("data: "):
            data = line[len("data: "):]
            yield data if data == "[DONE]" else json.loads(data)


def sse(lines) -> list[dict | str]:
    return list(sse_events(lines))
