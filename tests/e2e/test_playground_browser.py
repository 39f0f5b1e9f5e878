"""The playground in a real browser: headless Chromium (Debian package) driven by Playwright.

Opens the app on the packaged SmolLM2, types a code-editing prompt, presses Run, waits
for both panes and the statistics, checks that accepted draft tokens are highlighted,
and saves a screenshot to ``test-artifacts/e2e/`` (copied to docs/images/playground.png
for the documentation).
"""

from __future__ import annotations

import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip(
    "gradio", reason="the playground needs gradio: pip install speculative-llm[playground]"
)
pytest.importorskip(
    "torch", reason="the local engine needs torch: pip install speculative-llm[local]"
)
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="browser tests need playwright: pip install playwright"
)

from speculative_playground import build_app, launch  # noqa: E402
from speculative_playground.backend_pool import BackendPool  # noqa: E402
from speculative_playground.presets import find_preset  # noqa: E402
from speculative_playground.render import PROVENANCE_CLASSES  # noqa: E402
from speculative_playground.settings import RunSettings  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
REPO_ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO_ROOT / "test-artifacts" / "e2e"
DOCS_SCREENSHOT = REPO_ROOT / "docs" / "images" / "playground.png"
RUN_TIMEOUT_MS = 600_000  # a guard against hangs, not a performance check


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def app_url(smollm2_gguf: Path) -> Iterator[str]:
    pool = BackendPool(local_options={"threads": 2})
    app = build_app(pool=pool, defaults=RunSettings(model="smollm2-135m", max_tokens=96))
    _, url, _ = launch(app, port=free_port(), prevent_thread_lock=True, quiet=True)
    yield url
    app.close()
    pool.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if not CHROMIUM.exists():
        pytest.skip(f"Debian's chromium is not installed at {CHROMIUM} (apt-get install chromium)")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        yield browser
        browser.close()


def test_run_in_the_browser_highlights_draft_tokens(app_url: str, browser: object) -> None:
    page = browser.new_page(viewport={"width": 1440, "height": 1300})  # type: ignore[attr-defined]
    page.goto(app_url, wait_until="domcontentloaded", timeout=120_000)
    page.wait_for_selector("#run-button", timeout=120_000)

    prompt = find_preset("Code edit: add type hints").prompt
    box = page.locator("#prompt-box textarea")
    box.fill("")
    box.type(prompt[:40])  # typed like a user, then the rest pasted
    box.fill(prompt)
    page.click("#run-button")

    page.wait_for_selector("#baseline-pane .sp-pane[data-state='running']", timeout=RUN_TIMEOUT_MS)
    page.wait_for_selector("#run-status .sp-status-ok", timeout=RUN_TIMEOUT_MS)

    baseline_text = page.inner_text("#baseline-pane .sp-pane")
    speculative_text = page.inner_text("#speculative-pane .sp-pane")
    assert baseline_text.strip() and baseline_text == speculative_text
    draft_spans = page.locator(f"#speculative-pane .{PROVENANCE_CLASSES['draft']}")
    assert draft_spans.count() > 0
    colour = draft_spans.first.evaluate("e => getComputedStyle(e).backgroundColor")
    assert colour not in ("rgba(0, 0, 0, 0)", "transparent")  # the CSS really applies
    assert page.locator("#baseline-pane .sp-tok-draft").count() == 0
    cards = page.inner_text("#speedup-cards")
    assert "×" in cards and "interleaved timing" in cards
    stats = page.inner_text("#stats-table")
    assert "Acceptance rate" in stats and "%" in stats
    assert page.locator("#history-table").inner_text().count("ngram") >= 1

    page.mouse.move(0, 0)  # no hover effect in the screenshot
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    screenshot = ARTIFACTS / "playground.png"
    page.screenshot(path=str(screenshot), full_page=True)
    assert screenshot.stat().st_size > 10_000
    DOCS_SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(screenshot, DOCS_SCREENSHOT)
    page.close()
