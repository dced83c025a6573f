"""The web client in a real headless Chromium (Debian's, driven by Playwright), against a real gateway
on the default model: ask a calculator question and watch the stream, the tool call, the intercept
policy and the result appear. A screenshot goes to test-output/."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
OUT = Path(__file__).resolve().parents[3] / "test-output"

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="Chromium is not installed (scripts/test.sh installs Debian's chromium when it can)"
)
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]


async def test_calculator_question_in_the_browser(default_url: str) -> None:
    from playwright.async_api import async_playwright, expect

    OUT.mkdir(exist_ok=True)
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        try:
            page = await browser.new_page(viewport={"width": 1200, "height": 800})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            await page.goto(default_url + "/")
            await expect(page.get_by_test_id("health")).to_contain_text("policy infercept")
            await expect(page.get_by_test_id("tool-Calculator")).to_be_checked()
            # Count DOM updates in the chat log: a streamed answer arrives in many small pieces.
            await page.evaluate("""() => { window.__updates = 0;
                new MutationObserver((m) => { window.__updates += m.length; })
                  .observe(document.querySelector('#log'), {subtree: true, childList: true, characterData: true}); }""")
            await page.get_by_test_id("input").fill("What is 29 times 13?")
            await page.get_by_test_id("send").click()

            await expect(page.get_by_test_id("user-message")).to_have_text("What is 29 times 13?")
            await expect(page.get_by_test_id("tool-call")).to_contain_text("Calculator[29*13]", timeout=60_000)
            await expect(page.get_by_test_id("intercept-policy")).to_have_text("preserve")
            await expect(page.get_by_test_id("tool-result")).to_have_text("→ 377")
            await expect(page.get_by_test_id("call-time")).to_contain_text("call took")
            await expect(page.get_by_test_id("resume")).to_contain_text("resumed by preserve")
            await expect(page.get_by_test_id("reply")).to_have_text("final answer: 377", timeout=60_000)
            text = await page.get_by_test_id("assistant-message").inner_text()
            assert text.startswith("Thought:") and "Answer: 377" in text
            assert await page.evaluate("window.__updates") > 10  # tokens streamed in, not one block
            # The session is listed, and the KV panel shows the engine's blocks.
            await expect(page.get_by_test_id("sessions").locator("li")).to_have_count(1)
            await expect(page.locator("#kv tr[data-state=free] td").last).not_to_have_text("0", timeout=5_000)
            await page.screenshot(path=str(OUT / "web_client_calculator.png"), full_page=True)
            await expect(page.locator("#chatinfo")).to_contain_text("intercepts")
            assert not errors, errors
        finally:
            await browser.close()
