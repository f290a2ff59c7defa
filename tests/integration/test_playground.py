"""The playground in a real browser (Debian's Chromium, driven by Playwright) against real gunicorn and the model.

Screenshots at desktop and phone widths are kept in ``build/test-artifacts/playground/``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import threading
from pathlib import Path

import pytest
import requests

from tests.integration.conftest import MODEL_ID
from tests.support.server import Server, wait_until

CHROMIUM = os.environ.get("PHI_API_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "build" / "test-artifacts" / "playground"
# What the machine's closed network needs (a probe saw Chromium's background connections refused, many at a time).
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]


@pytest.fixture(scope="module")
def browser():
    if not shutil.which(CHROMIUM):
        pytest.fail(f"The playground tests need Chromium at {CHROMIUM}: install Debian's package "
                    "(make test installs it as root: tests/system_packages.sh) or set PHI_API_CHROMIUM to another "
                    "Chromium.")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


class Visit:
    """A page of the playground, with what went wrong in it."""

    def __init__(self, browser, url: str, width: int = 1280, height: int = 800, bypass_csp: bool = True) -> None:
        # The page's Content-Security-Policy forbids evaluating strings, which some of Playwright's waits do;
        # the test of hostile markup keeps the policy on and uses only locators.
        self.context = browser.new_context(viewport={"width": width, "height": height}, bypass_csp=bypass_csp)
        self.page = self.context.new_page()
        self.console_errors: list[str] = []
        self.dialogs: list[str] = []
        self.page.on("console", lambda message: message.type == "error" and self.console_errors.append(message.text))
        self.page.on("pageerror", lambda error: self.console_errors.append(str(error)))
        self.page.on("dialog", lambda dialog: (self.dialogs.append(dialog.message), dialog.dismiss()))
        self.page.goto(url + "/")

    def set(self, field: str, value: str) -> None:
        """Fill a field of the settings panel (opened with its button on a phone-width screen)."""
        folded = not self.page.locator(field).is_visible()
        if folded:
            self.page.click("#toggle-settings")
        self.page.fill(field, value)
        if folded:
            self.page.click("#toggle-settings")

    def ask(self, text: str, max_tokens: int | None = None, temperature: float | None = None) -> None:
        page = self.page
        page.locator("#model option").first.wait_for(state="attached")
        if max_tokens is not None:
            self.set("#max-tokens", str(max_tokens))
        if temperature is not None:  # 0: greedy, for tests that need an answer that does not end early
            self.set("#temperature", f"{temperature:g}")
            assert page.locator("#temperature-value").inner_text() == f"{temperature:g}"
        page.fill("#prompt", text)
        page.click("#send")

    def last_answer(self):
        return self.page.locator(".message.assistant").last

    def wait_for_meta(self) -> str:
        meta = self.last_answer().locator(".meta")
        meta.wait_for(timeout=60_000)
        return meta.inner_text()

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def visit(browser):
    opened: list[Visit] = []

    def open_page(url: str, **viewport) -> Visit:
        opened.append(Visit(browser, url, **viewport))
        return opened[-1]

    yield open_page
    for page in opened:
        page.close()


def test_a_message_streams_token_by_token_then_shows_its_figures(visit, server):
    page = visit(server.url)
    page.ask("Tell me a long story about a lighthouse keeper.", max_tokens=300, temperature=0)
    body = page.last_answer().locator(".body")
    page.page.wait_for_function("document.querySelector('.message.assistant .body').innerText.length > 5")
    first = len(body.inner_text())
    grown = page.page.wait_for_function(
        f"document.querySelector('.message.assistant .body').innerText.length > {first} "
        "&& !document.querySelector('.message.assistant .meta')")  # longer, and still streaming
    assert grown
    meta = page.wait_for_meta()
    assert re.search(r"finish: (stop|length)", meta) and "tokens:" in meta and "ttft" in meta and "tok/s" in meta
    assert page.console_errors == [] and page.dialogs == []


def test_the_page_keeps_the_conversation_and_starts_anew(visit, server):
    page = visit(server.url)
    page.ask("What is the capital of France?", max_tokens=16)
    page.wait_for_meta()
    page.ask("And of Italy?", max_tokens=16)
    page.wait_for_meta()
    assert page.page.locator(".message.user").count() == 2 and page.page.locator(".message.assistant").count() == 2
    page.page.click("#new-chat")
    assert page.page.locator(".message").count() == 0


def test_an_answer_cut_by_max_tokens_says_so(visit, server):
    page = visit(server.url)
    page.ask("Count from one to one hundred, in words.", max_tokens=5, temperature=0)
    assert "finish: length" in page.wait_for_meta()
    assert "max_tokens" in page.last_answer().locator(".note").inner_text()


@pytest.fixture(scope="module")
def one_slot(model_path, logs_dir):
    with Server(logs_dir, MODEL_PATH=model_path, MODEL_ID=MODEL_ID, WEB_CONCURRENCY=1,
                MAX_CONCURRENT_REQUESTS=1) as running:
        yield running


def test_stop_aborts_and_the_server_frees_the_slot(visit, one_slot):
    page = visit(one_slot.url)
    page.set("#system", "You write very long answers.")
    page.ask("Write an essay about the sea.", max_tokens=2000, temperature=0)
    page.page.wait_for_function("document.querySelector('.message.assistant .body').innerText.length > 20")
    page.page.click("#stop")
    assert "Stopped" in page.last_answer().locator(".note").inner_text()
    wait_until(lambda: "finish_reason=cancelled" in one_slot.log(), timeout=5, message="the cancellation")
    small = {"model": MODEL_ID, "prompt": "Hi", "max_tokens": 1}
    assert requests.post(one_slot.url + "/v1/completions", json=small, timeout=30).status_code == 200
    assert page.console_errors == []


def drain(lines) -> None:
    """Read a stream to its end, or until the test closes it under the reader."""
    with contextlib.suppress(requests.RequestException, AttributeError, OSError):
        for _ in lines:
            pass


def test_a_full_server_s_429_is_shown(visit, one_slot):
    body = {"model": MODEL_ID, "prompt": "Count:", "max_tokens": 2000, "ignore_eos": True, "stream": True}
    with requests.post(one_slot.url + "/v1/completions", json=body, stream=True, timeout=60) as held:
        lines = held.iter_lines()
        next(line for line in lines if line.startswith(b"data: {"))  # it runs: the one slot is taken
        # Keep reading it: a client that stops reading loses its stream (and the slot) within seconds.
        threading.Thread(target=drain, args=(lines,), daemon=True).start()
        page = visit(one_slot.url)
        page.ask("Hello?")
        failed = page.page.locator(".message.assistant.failed .body")
        failed.wait_for(timeout=30_000)
        assert failed.inner_text() == "429: Too many concurrent requests. Please try again later."
    assert page.console_errors == [] or all("429" in error for error in page.console_errors)


@pytest.fixture(scope="module")
def keyed(model_path, logs_dir):
    with Server(logs_dir, MODEL_PATH=model_path, MODEL_ID=MODEL_ID, WEB_CONCURRENCY=1,
                API_KEYS="playground-key") as running:
        yield running


def test_a_key_protected_server_asks_for_the_key_then_answers(visit, keyed):
    assert requests.get(keyed.url + "/").status_code == 200  # the page itself needs no key
    page = visit(keyed.url)
    dialog = page.page.locator("#key-dialog")
    dialog.wait_for(state="visible")
    page.page.fill("#key-input", "playground-key")
    page.page.click("#key-save")
    page.ask("Say hello.", max_tokens=8)
    assert "finish:" in page.wait_for_meta()
    assert page.page.evaluate("localStorage.getItem('phi-api-key')") == "playground-key"
    assert "failed" not in page.last_answer().get_attribute("class")


HOSTILE = '<img src=x onerror="alert(1)"> <script>alert(2)</script> **bold** [link](javascript:alert(3))'


def test_markup_from_the_model_or_the_prompt_is_shown_as_text_never_run(visit, server):
    page = visit(server.url, bypass_csp=False)
    chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
              {"choices": [{"index": 0, "delta": {"content": HOSTILE}, "finish_reason": None}]},
              {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
              {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 9, "total_tokens": 12}}]
    stream = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks) + "data: [DONE]\n\n"
    # A model that answers with markup: the server's answer is replaced on its way to the page.
    page.page.route("**/v1/chat/completions",
                    lambda route: route.fulfill(status=200, content_type="text/event-stream", body=stream))
    page.ask('<script>alert("prompt")</script>')
    page.wait_for_meta()
    answer = page.last_answer().locator(".body")
    text = answer.inner_text()
    assert '<img src=x onerror="alert(1)">' in text and "<script>alert(2)</script>" in text
    assert answer.locator("img, script").count() == 0 and answer.locator("strong").inner_text() == "bold"
    assert answer.locator("a[href^='javascript']").count() == 0
    assert page.page.locator(".message.user .body").inner_text() == '<script>alert("prompt")</script>'
    assert page.dialogs == [] and page.console_errors == []


@pytest.mark.parametrize("name,width,height", [("desktop", 1280, 800), ("phone", 390, 844)])
def test_screenshots_at_desktop_and_phone_widths(visit, server, name, width, height):
    page = visit(server.url, width=width, height=height)
    page.set("#system", "You are a concise assistant.")
    page.ask("Give me three tips for writing clear code, as a list.", max_tokens=120)
    page.wait_for_meta()
    composer = page.page.locator("#composer").bounding_box()
    assert composer["x"] >= 0 and composer["x"] + composer["width"] <= width + 1  # nothing runs off the screen
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
    print(f"screenshot: {ARTIFACTS / f'{name}.png'}")
    assert (ARTIFACTS / f"{name}.png").stat().st_size > 10_000
