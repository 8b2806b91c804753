"""The chat page `plan serve` shows at / (runtime/chat.html), in headless Chromium driven by selenium,
against the real Gemma 3 270M served with --api-key: the page asks for the key, shows the model's
name, streams an answer to a typed prompt, keeps the conversation, and stops a long answer (the server
cancels it). The test keeps a screenshot: $LLMPLAN_ARTIFACTS/chat_page.png (default artifacts/ in the
repository)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from serve_harness import Served  # noqa: F401 (skips this module without the serve extras)

from conftest import GEMMA_KEY

ARTIFACTS = Path(os.environ.get("LLMPLAN_ARTIFACTS", Path(__file__).resolve().parents[1] / "artifacts"))
CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")

if not (CHROMIUM and DRIVER):  # CI installs them (.ci/run): there the test must run
    if os.environ.get("CI"):
        raise RuntimeError("the chat page's test needs Debian's chromium and chromium-driver")
    pytest.skip("no chromium and chromedriver here (apt-get install chromium chromium-driver)", allow_module_level=True)
webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


@pytest.fixture(scope="module")
def page(served_gemma, tmp_path_factory):
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    # the closed network: nothing may make Chromium wait on an outside host
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1100,800", f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"):
        opts.add_argument(flag)
    browser = webdriver.Chrome(service=webdriver.ChromeService(executable_path=DRIVER), options=opts)
    browser.set_page_load_timeout(30)
    try:
        browser.get(served_gemma.url + "/")
        yield browser
    finally:
        browser.quit()


def _until(page, what, timeout: float = 60.0):
    return WebDriverWait(page, timeout, poll_frequency=0.05).until(lambda p: what())


def _answers(page):
    return page.find_elements(By.CSS_SELECTOR, ".msg.assistant, .msg.error")


def test_the_page_asks_for_the_key_then_shows_the_model(page):
    _until(page, lambda: "API key" in page.find_element(By.ID, "status").text)
    key = page.find_element(By.ID, "api-key")
    key.send_keys(GEMMA_KEY)
    key.send_keys(Keys.TAB)  # the change event: the page asks /v1/models again, with the key
    _until(page, lambda: page.find_element(By.ID, "model").text.startswith("gemma"))
    assert "context 512" in page.find_element(By.ID, "context").text


def test_a_typed_prompt_streams_an_answer(page):
    page.find_element(By.ID, "temperature").clear()
    page.find_element(By.ID, "temperature").send_keys("0")
    page.find_element(By.ID, "max-tokens").clear()
    page.find_element(By.ID, "max-tokens").send_keys("48")
    prompt = page.find_element(By.ID, "prompt")
    prompt.send_keys("Write three sentences about the sea.")
    prompt.send_keys(Keys.ENTER)
    answer = _until(page, lambda: _answers(page))[-1]
    seen = [_until(page, lambda: answer.find_element(By.CLASS_NAME, "text").text)]
    _until(page, lambda: answer.get_attribute("data-done"))
    seen.append(answer.find_element(By.CLASS_NAME, "text").text)
    assert answer.get_attribute("class") == "msg assistant" and answer.get_attribute("data-done") in ("stop", "length")
    assert len(seen[1]) > len(seen[0]) > 0 and seen[1].startswith(seen[0])  # it grew as it streamed
    assert page.execute_script("return conversation.length") == 2  # the page keeps the conversation
    assert not page.find_element(By.ID, "send").get_property("disabled")


def test_stop_ends_a_long_answer(page, served_gemma):
    page.find_element(By.ID, "max-tokens").clear()
    page.find_element(By.ID, "max-tokens").send_keys("460")
    prompt = page.find_element(By.ID, "prompt")
    prompt.send_keys("Now tell me a very long story about a lighthouse keeper.")
    page.find_element(By.ID, "send").click()
    _until(page, lambda: len(_answers(page)) == 2)
    answer = _answers(page)[-1]
    _until(page, lambda: len(answer.find_element(By.CLASS_NAME, "text").text) > 20)
    t0 = time.monotonic()
    page.find_element(By.ID, "stop").click()
    _until(page, lambda: answer.get_attribute("data-done"), timeout=10)
    assert answer.get_attribute("data-done") == "stopped" and time.monotonic() - t0 < 10
    assert page.find_element(By.ID, "status").text == "stopped"
    served_gemma.wait_for(lambda m: m["llmplan_requests_running"] == 0)  # the server cancelled it
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.save_screenshot(str(ARTIFACTS / "chat_page.png"))
    assert page.execute_script("return conversation.length") == 4
