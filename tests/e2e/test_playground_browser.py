"""The playground in a real browser: headless Chromium (Debian package) driven by Playwright.

On the packaged SmolLM2 (interleaved timing, the local default):

* at 1440x900, both panes stream side by side above the fold with the prompt; a
  preset picked just before Run is the prompt that runs; the tokens-over-time chart
  has a line per side with a point per token; accepted draft tokens are highlighted;
* Stop in the middle of a run leaves "stopped" (or "not started") everywhere and no
  headline speedup;
* at phone width (390x844) the prompt comes first, the panes stack, nothing overflows
  the page, the settings toggle is a 44 px target and the settings open fully on screen;
* a run slowed on purpose (the ``slow-verify`` runner adds latency to every verify pass
  that checks a draft, as a busy machine would) is followed by a run that still
  drafts on the default prompt, and the page gives the engine's reason for short drafts
  instead of guessing;
* a second tab's run waits visibly in the queue and Stop takes it out within a second;
* a long prompt shows what the side waits for; the URL backend points to --allow-url;
  the structured preset sets its token budget; the prompt has a visible focus ring;
* text and marks meet their contrast ratios (4.5:1, 3:1), computed from the page's
  styles, in the light and the dark theme;
* the method picker offers only what the chosen backend runs, and the greedy hint only
  what the chosen exactness promises; Run is disabled while its comparison runs; a run
  that fails leaves no earlier results standing; the History headers are readable at
  phone width (no header cut off, overlapping or broken inside a word);
* the app writes no error or warning to the browser console.

Screenshots go to ``test-artifacts/e2e/``; with ``SPECULATIVE_LLM_UPDATE_SCREENSHOTS=1``
they are also copied to ``docs/images/`` for the documentation (a plain test run leaves
tracked files alone). No Playwright browser is downloaded: Debian's ``/usr/bin/chromium`` runs.
"""

from __future__ import annotations

import itertools
import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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

from slow_verify import SLOW_VERIFY_RUNNER, VerifyDelay, register_slow_verify  # noqa: E402
from speculative_playground import build_app, launch  # noqa: E402
from speculative_playground.backend_pool import BackendPool, build_backend_by_name  # noqa: E402
from speculative_playground.history import TABLE_HEADERS  # noqa: E402
from speculative_playground.presets import CUSTOM, find_preset  # noqa: E402
from speculative_playground.render import PROVENANCE_CLASSES  # noqa: E402
from speculative_playground.settings import (  # noqa: E402
    BACKEND_KINDS,
    EXACT_LABELS,
    METHOD_LABELS,
    RunSettings,
)

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
DOCS_IMAGES = REPO_ROOT / "docs" / "images"
RUN_TIMEOUT_MS = 600_000  # a guard against hangs, not a performance check
DESKTOP = {"width": 1440, "height": 900}
PHONE = {"width": 390, "height": 844}
TEXT_RATIO, MARK_RATIO = 4.5, 3.0  # WCAG 2.2: text 1.4.3, non-text marks 1.4.11

# Both panes hold some lines while both sides run: the race, seen as it happens.
WATCH_THE_RACE = """() => {
  window.spBothStreaming = null;
  const text = (side) => {
    const pane = document.querySelector(`#${side}-pane .sp-pane[data-state="running"]`);
    if (!pane || pane.querySelector(".sp-placeholder")) { return ""; }
    return pane.querySelector(".sp-pane-text").textContent.trim();
  };
  const box = (selector) => {
    const r = document.querySelector(selector).getBoundingClientRect();
    return {top: r.top, bottom: r.bottom, left: r.left, right: r.right};
  };
  const look = () => {
    // A few tokens on each side: on a copy-heavy preset the cost-aware default drafts up
    // to 12 tokens a step and can end at five times the baseline's speed, when the
    // baseline has written only a line.
    if (window.spBothStreaming || text("baseline").length < 12
        || text("speculative").length < 12) { return; }
    window.spBothStreaming = {  // where the panes are, the moment both hold text
      baseline: box("#baseline-pane .sp-pane"), speculative: box("#speculative-pane .sp-pane"),
      prompt: box("#prompt-box textarea"),
    };
  };
  new MutationObserver(look).observe(document.body, {subtree: true, childList: true,
    characterData: true, attributes: true});
}"""

# Contrast of each [selector, colour property, minimum] against the colour beneath it:
# the element's own background over its ancestors' (alpha composited), or, for a
# background colour, its parent's. SVG marks are measured against the chart's box.
CONTRASTS = """(checks) => {
  const parse = (value) => {
    let m = value.match(/^rgba?\\(([^)]*)\\)$/);
    if (m) {
      const p = m[1].split(/[\\s,\\/]+/).filter(Boolean).map(Number);
      return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
    }
    m = value.match(/^color\\(srgb ([^)]*)\\)$/);
    if (m) {
      const p = m[1].split(/[\\s\\/]+/).filter(Boolean).map(Number);
      return [p[0] * 255, p[1] * 255, p[2] * 255, p.length > 3 ? p[3] : 1];
    }
    return null;
  };
  const over = (top, bottom) => [0, 1, 2].map((i) => top[i] * top[3] + bottom[i] * (1 - top[3]))
    .concat([1]);
  const beneath = (element) => {
    const layers = [];
    for (let e = element; e; e = e.parentElement) {
      const colour = parse(getComputedStyle(e).backgroundColor);
      if (colour === null) { return null; }
      if (colour[3] > 0) { layers.push(colour); if (colour[3] >= 1) { break; } }
    }
    return layers.reverse().reduce((under, layer) => over(layer, under), [255, 255, 255, 1]);
  };
  const luminance = (c) => {
    const [r, g, b] = c.slice(0, 3).map((v) => {
      v /= 255;
      return v <= 0.04045 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4;
    });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  };
  const ratio = (a, b) => {
    const [x, y] = [luminance(a), luminance(b)].sort((p, q) => q - p);
    return (x + 0.05) / (y + 0.05);
  };
  return checks.map(([selector, property, minimum]) => {
    const element = document.querySelector(selector);
    if (!element) { return {selector, property, minimum, missing: true}; }
    const svg = element.closest("svg");
    const under = property === "backgroundColor" ? element.parentElement
      : svg ? svg.parentElement : element;
    const bg = beneath(under);
    const raw = parse(getComputedStyle(element)[property]);
    if (raw === null || bg === null) {
      return {selector, property, minimum, unparsed: getComputedStyle(element)[property]};
    }
    const fg = over(raw, bg);
    return {selector, property, minimum, ratio: Math.round(ratio(fg, bg) * 100) / 100,
      fg: fg.map(Math.round), bg: bg.map(Math.round)};
  });
}"""

TEXT = "color"
CONTRAST_CHECKS: list[tuple[str, str, float]] = [
    (f"#speculative-pane mark.{PROVENANCE_CLASSES['draft']}", "backgroundColor", MARK_RATIO),
    (f"#speculative-pane mark.{PROVENANCE_CLASSES['draft']}", TEXT, TEXT_RATIO),
    (f"#speculative-pane .{PROVENANCE_CLASSES['target']}", TEXT, TEXT_RATIO),
    ("#baseline-pane .sp-pane-text", TEXT, TEXT_RATIO),
    (".sp-header p", TEXT, TEXT_RATIO),
    (".sp-badge", TEXT, TEXT_RATIO),
    (".sp-tip", TEXT, TEXT_RATIO),
    (".sp-section-title small", TEXT, TEXT_RATIO),
    (".sp-legend-item", TEXT, TEXT_RATIO),
    (".sp-status", TEXT, TEXT_RATIO),
    (".sp-card-title", TEXT, TEXT_RATIO),
    (".sp-card-detail", TEXT, TEXT_RATIO),
    (".sp-basis", TEXT, TEXT_RATIO),
    (".sp-stats thead th", TEXT, TEXT_RATIO),
    (".sp-note", TEXT, TEXT_RATIO),
    (".sp-chart-summary", TEXT, TEXT_RATIO),
    (".sp-tick", "fill", TEXT_RATIO),
    (".sp-axis-title", "fill", TEXT_RATIO),
    (".sp-line-baseline", "stroke", MARK_RATIO),
    (".sp-line-speculative", "stroke", MARK_RATIO),
    (".sp-bar", "fill", MARK_RATIO),
    ("#prompt-box [data-testid='block-info']", TEXT, TEXT_RATIO),
    ("#prompt-box textarea", TEXT, TEXT_RATIO),
    ("#history-table td", TEXT, TEXT_RATIO),
    ("#run-button", TEXT, TEXT_RATIO),
]


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
def verify_delay() -> VerifyDelay:
    """The delay of the ``slow-verify`` runner's passes that check a draft (0 at first)."""
    return register_slow_verify()


@pytest.fixture(scope="module")
def one_thread_app_url(smollm2_gguf: Path, verify_delay: VerifyDelay) -> Iterator[str]:
    """The app on one thread: its verify passes cost what the rows compute, not what
    another process's load does to a 2-thread pass on a shared 2-core machine (there a
    multi-row pass measured 15-60 one-token passes, and drafting rightly stops).

    On the ``slow-verify`` runner (llama.cpp's, its passes slowed while a test sets
    ``verify_delay``), in the app's process: a worker process would not see the delay."""
    pool = BackendPool(
        local_options={"threads": 1, "runner": SLOW_VERIFY_RUNNER},
        backend_factory=build_backend_by_name,
    )
    app = build_app(pool=pool, defaults=RunSettings(model="smollm2-135m", max_tokens=96))
    _, url, _ = launch(app, port=free_port(), prevent_thread_lock=True, quiet=True)
    yield url
    app.close()
    pool.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.skip(f"Debian's chromium is not installed at {CHROMIUM} (apt-get install chromium)")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        yield browser
        browser.close()


class Console:
    """Every console message and uncaught error of a page."""

    def __init__(self, page: Any) -> None:
        self.messages: list[str] = []
        page.on("console", lambda m: self.messages.append(f"{m.type}: {m.text}"))
        page.on("pageerror", lambda error: self.messages.append(f"pageerror: {error}"))

    def problems(self) -> list[str]:
        """Errors and warnings (Chromium's console types ``error`` and ``warning``)."""
        return [m for m in self.messages if m.split(":", 1)[0] in ("error", "warning", "pageerror")]


def open_page(browser: Any, url: str, viewport: dict[str, int], **options: Any) -> Any:
    page = browser.new_page(viewport=viewport, **options)
    page.spconsole = Console(page)
    page.goto(url, wait_until="domcontentloaded", timeout=120_000)
    page.wait_for_selector("#run-button", timeout=120_000)
    page.wait_for_selector("#run-status .sp-status", timeout=120_000)
    return page


def choose_preset(page: Any, name: str) -> None:
    page.click("#preset-name input")
    page.get_by_role("option", name=name, exact=True).click()


def run_to_the_end(page: Any) -> None:
    page.click("#run-button")
    page.wait_for_selector("#run-status .sp-status-running", timeout=RUN_TIMEOUT_MS)
    page.wait_for_selector("#run-status .sp-status-ok", timeout=RUN_TIMEOUT_MS)


def stats_row(page: Any, label: str) -> list[str]:
    """The baseline and speculative cells of one row of the statistics table."""
    row = page.locator("#stats-table tr", has=page.locator(f"th:text-is('{label}')"))
    return [cell.strip() for cell in row.locator("td").all_inner_texts()]


def history_rows(page: Any) -> list[str]:
    """The history table's data rows, newest first, each as one line of text."""
    rows = page.locator("#history-table [role='row']:has([role='gridcell'])")
    return [" ".join(text.split()) for text in rows.all_inner_texts()]


def contrast_failures(page: Any) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = page.evaluate(CONTRASTS, CONTRAST_CHECKS)
    return [r for r in results if "ratio" not in r or r["ratio"] < r["minimum"]]


def save_screenshot(page: Any, name: str, *, full_page: bool = False) -> None:
    page.mouse.move(0, 0)  # no hover effect in the screenshot
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path), full_page=full_page)
    assert path.stat().st_size > 10_000
    if os.environ.get("SPECULATIVE_LLM_UPDATE_SCREENSHOTS") == "1":
        DOCS_IMAGES.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, DOCS_IMAGES / name)


def test_the_race_at_1440x900(app_url: str, browser: Any) -> None:
    page = open_page(browser, app_url, DESKTOP, color_scheme="light")
    assert page.locator("#settings-sidebar.open").count() == 1  # wide: settings open

    # Run is the next stop after the prompt; the status line is a live region.
    page.focus("#prompt-box textarea")
    page.keyboard.press("Tab")
    assert page.evaluate("() => document.activeElement.id") == "run-button"
    assert page.locator("#run-status [aria-live='polite']").count() == 1

    # A preset picked just before Run is the prompt that runs.
    preset = find_preset("Code edit: rename a method")
    choose_preset(page, preset.name)
    page.evaluate(WATCH_THE_RACE)
    page.click("#run-button")
    page.wait_for_function(
        "() => window.spBothStreaming !== null || document.querySelector("
        "'#run-status .sp-status-ok, #run-status .sp-status-warn, #run-status .sp-status-error')",
        timeout=RUN_TIMEOUT_MS,
    )
    save_screenshot(page, "playground-race.png")  # mid-race, unless the race never was
    page.wait_for_selector("#run-status .sp-status-ok", timeout=RUN_TIMEOUT_MS)

    race = page.evaluate("() => window.spBothStreaming")
    assert race is not None, "the panes never held text at the same time"
    base, spec, prompt = race["baseline"], race["speculative"], race["prompt"]
    assert abs(base["top"] - spec["top"]) < 2 and base["right"] <= spec["left"]  # side by side
    assert prompt["top"] >= 0 and base["bottom"] <= DESKTOP["height"]  # all above the fold
    assert spec["bottom"] <= DESKTOP["height"]

    ran = history_rows(page)[0]
    assert " ".join(preset.prompt.split())[:40] in ran
    baseline_text = page.inner_text("#baseline-pane .sp-pane-text")
    speculative_text = page.inner_text("#speculative-pane .sp-pane-text")
    assert baseline_text.strip() and baseline_text == speculative_text
    drafts = page.locator(f"#speculative-pane mark.{PROVENANCE_CLASSES['draft']}")
    assert drafts.count() > 0 and drafts.first.get_attribute("title") == "accepted draft tokens"
    assert page.locator("#baseline-pane .sp-tok-draft").count() == 0

    # The chart draws a line per side with a point per token.
    tokens = [int(n) for n in stats_row(page, "Tokens generated")]
    for side, count in zip(("baseline", "speculative"), tokens, strict=True):
        line = page.locator(f"#timeline-chart polyline[data-side='{side}']")
        assert len((line.get_attribute("points") or "").split()) == count > 0
    assert page.locator("#acceptance-chart rect.sp-bar").count() > 0
    cards = page.inner_text("#speedup-cards")
    assert "×" in cards and "interleaved timing" in cards
    assert "own steps" in page.inner_text("#speedup-basis")
    assert "Baseline:" in page.inner_text("#timeline-chart figcaption")

    assert contrast_failures(page) == []
    save_screenshot(page, "playground.png", full_page=True)
    assert page.spconsole.problems() == []
    page.close()


def test_stop_mid_run_says_stopped_everywhere(app_url: str, browser: Any) -> None:
    page = open_page(browser, app_url, DESKTOP, color_scheme="light")
    box = page.locator("#prompt-box textarea")
    box.fill("Count from 1 to 400, one number per line, and nothing else.")
    page.wait_for_function(
        f"() => document.querySelector('#preset-name input').value === {CUSTOM!r}"
    )
    page.fill("input[aria-label='number input for Max tokens']", "600")
    page.keyboard.press("Tab")
    box.press("Control+Enter")  # Ctrl+Enter in the prompt runs
    page.wait_for_function(
        "() => { const p = document.querySelector('#speculative-pane .sp-pane');"
        " return p && p.dataset.state === 'running' && !p.querySelector('.sp-placeholder')"
        " && p.textContent.trim().length > 4; }",
        timeout=RUN_TIMEOUT_MS,
    )
    page.click("#stop-button")
    page.wait_for_function(  # "Stopping both sides…" first, then how each side ended
        "() => document.querySelector('#run-status').innerText.startsWith('Stopped')",
        timeout=RUN_TIMEOUT_MS,
    )

    status = page.inner_text("#run-status")
    assert status.startswith("Stopped")
    sides = stats_row(page, "Status")
    assert sides[1] == "stopped" and sides[0] in ("stopped", "done")
    for side, word in zip(("baseline", "speculative"), sides, strict=True):
        assert f"{side} {word}" in status
        assert page.get_attribute(f"#{side}-pane .sp-pane", "data-state") == word
    assert page.locator(".sp-caret").count() == 0
    title = page.locator("#speedup-cards .sp-card-title").first.text_content()
    value = page.locator("#speedup-cards .sp-card-value").first.text_content()
    assert title == "Measured speedup (partial)" or value == "—"
    assert "not a full run" in page.inner_text("#speedup-cards") or value == "—"
    assert history_rows(page)[0].endswith("stopped")  # the same word in the history
    assert "cancel" not in page.inner_text("body").lower()
    assert page.spconsole.problems() == []
    page.close()


def test_phone_width_shows_the_prompt_first(app_url: str, browser: Any) -> None:
    page = open_page(browser, app_url, PHONE, is_mobile=True, has_touch=True)
    assert page.locator("#settings-sidebar.open").count() == 0
    # Nothing covers the prompt: it is what a tap in its middle reaches.
    reached = page.evaluate(
        "() => { const r = document.querySelector('#prompt-box textarea').getBoundingClientRect();"
        " const hit = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);"
        " return [r.top, r.bottom, hit && hit.closest('#prompt-box') !== null]; }"
    )
    assert reached[0] >= 0 and reached[1] <= PHONE["height"] and reached[2] is True
    save_screenshot(page, "playground-phone.png")
    # The panes stack, full width; nothing overflows the page sideways.
    base = page.locator("#baseline-pane").bounding_box()
    spec = page.locator("#speculative-pane").bounding_box()
    assert base is not None and spec is not None
    assert spec["y"] >= base["y"] + base["height"] - 1 and base["width"] > PHONE["width"] * 0.8
    assert page.evaluate("() => document.documentElement.scrollWidth") <= PHONE["width"]
    toggle = page.locator("#settings-sidebar .toggle-button").bounding_box()
    assert toggle is not None and toggle["width"] >= 44 and toggle["height"] >= 44
    page.locator("#speculative-pane").scroll_into_view_if_needed()
    save_screenshot(page, "playground-phone-panes.png")
    page.evaluate("() => window.scrollTo(0, 0)")

    page.click("#settings-sidebar .toggle-button")
    page.wait_for_selector("#settings-sidebar.open")
    page.wait_for_timeout(500)  # the sidebar slides in
    for selector in ("#settings-sidebar .sidebar-content", "#settings-sidebar .toggle-button"):
        box = page.locator(selector).bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"]
    page.click("#settings-sidebar .toggle-button")
    page.wait_for_selector("#settings-sidebar:not(.open)")
    assert page.spconsole.problems() == []
    page.close()


def test_dark_theme_contrast(app_url: str, browser: Any) -> None:
    page = open_page(browser, f"{app_url}?__theme=dark", DESKTOP, color_scheme="dark")
    assert page.locator("body.dark, .dark").count() > 0
    run_to_the_end(page)
    assert contrast_failures(page) == []
    page.evaluate("() => window.scrollTo(0, 0)")
    save_screenshot(page, "playground-dark.png")
    assert page.spconsole.problems() == []
    page.close()


def test_contrast_check_catches_a_pale_highlight(app_url: str, browser: Any) -> None:
    # The check itself: the old highlight (emerald at 20% over white) fails it.
    page = open_page(browser, app_url, DESKTOP, color_scheme="light")
    page.evaluate(
        "() => document.querySelector('#baseline-pane .sp-pane-text').insertAdjacentHTML("
        '\'beforeend\', \'<mark class="sp-tok sp-tok-draft" id="probe" '
        'style="background: rgba(16, 185, 129, 0.2); color: inherit">x</mark>\')'
    )
    (result,) = page.evaluate(CONTRASTS, [["#probe", "backgroundColor", MARK_RATIO]])
    assert result["ratio"] == pytest.approx(1.21, abs=0.02)
    page.close()


def draft_tokens_of_the_speculative_side(page: Any) -> int:
    return int(stats_row(page, "Proposed draft tokens")[1])


def test_a_run_after_a_slowed_run_still_drafts(
    one_thread_app_url: str, browser: Any, verify_delay: VerifyDelay
) -> None:
    page = open_page(browser, one_thread_app_url, DESKTOP, color_scheme="light")
    default = page.input_value("#prompt-box textarea")
    assert default.strip()
    verify_delay.seconds = 0.08  # every pass that checks a draft: +80 ms
    try:
        run_to_the_end(page)
    finally:
        verify_delay.seconds = 0.0
    slowed = draft_tokens_of_the_speculative_side(page)
    run_to_the_end(page)
    assert page.input_value("#prompt-box textarea") == default  # the same default prompt
    after = draft_tokens_of_the_speculative_side(page)
    assert after > 0, f"no drafts after the slowed run (it drafted {slowed})"
    # The reason is the engine's, never "prompt lookup found nothing to copy".
    notes = page.inner_text("#stats-table")
    assert "Draft lengths: Of " in notes and "decoding steps" in notes
    assert "nothing to copy" not in page.inner_text("#acceptance-chart")
    assert "needs acceptance figures" not in page.inner_text("#speedup-cards")
    cpu = stats_row(page, "CPU time")
    assert all(cell.endswith("s") for cell in cpu), cpu  # measured for both sides
    save_screenshot(page, "playground-after-slow-run.png", full_page=True)
    assert page.spconsole.problems() == []
    page.close()


def test_a_queued_run_is_visible_and_stop_cancels_it(app_url: str, browser: Any) -> None:
    first = open_page(browser, app_url, DESKTOP, color_scheme="light")
    second = open_page(browser, app_url, DESKTOP, color_scheme="light")
    first.fill("#prompt-box textarea", "Count from 1 to 400, one number per line.")
    # The page drops the preset once it sees the edit; run only then, or the run may take
    # the preset's prompt, whose short answer can end before Stop is pressed.
    first.wait_for_function(
        f"() => document.querySelector('#preset-name input').value === {CUSTOM!r}"
    )
    first.fill("input[aria-label='number input for Max tokens']", "600")
    first.keyboard.press("Tab")
    first.click("#run-button")
    first.wait_for_selector("#run-status .sp-status-running", timeout=RUN_TIMEOUT_MS)
    second.click("#run-button")
    second.wait_for_selector("#run-status .sp-status-queued", timeout=60_000)
    assert "Queued" in second.inner_text("#run-status")
    save_screenshot(second, "playground-queued.png")
    second.click("#stop-button")
    # Within a second (the queue looks every 0.25 s; a generous bound for a busy machine).
    second.wait_for_function(
        "() => document.querySelector('#run-status').innerText.includes('Stopped before')",
        timeout=5_000,
    )
    # Still running: a run that ended first would never say "Stopped" (a wait, not a failure).
    assert first.locator("#run-status .sp-status-running").count() == 1, first.inner_text(
        "#run-status"
    )
    first.click("#stop-button")
    first.wait_for_function(
        "() => document.querySelector('#run-status').innerText.startsWith('Stopped')",
        timeout=RUN_TIMEOUT_MS,
    )
    second.wait_for_timeout(1500)  # the cancelled run must not start after all
    assert "Stopped before" in second.inner_text("#run-status")
    assert second.locator("#run-status .sp-status-running").count() == 0
    for page in (first, second):
        assert page.spconsole.problems() == []
        page.close()


def test_waiting_words_the_url_hint_presets_and_focus(app_url: str, browser: Any) -> None:
    page = open_page(browser, app_url, DESKTOP, color_scheme="light")
    # The prompt box shows where the keyboard is.
    page.focus("#prompt-box textarea")
    outline = page.evaluate(
        "() => getComputedStyle(document.querySelector('#prompt-box textarea')).outlineStyle"
    )
    assert outline not in ("none", "")
    # The structured preset sets the budget its answer needs.
    choose_preset_in(page, "Structured output", "Incident report to JSON")
    budget = find_preset("Incident report to JSON").max_tokens
    page.wait_for_function(
        "(n) => document.querySelector(\"input[aria-label='number input for Max tokens']\")"
        ".value === String(n)",
        arg=budget,
    )
    # Editing the prompt drops the preset's tip with the preset.
    page.fill("#prompt-box textarea", "x" * 9000 + " Summarise the text above.")
    page.wait_for_function(
        f"() => document.querySelector('#preset-name input').value === {CUSTOM!r}"
    )
    assert page.inner_text("#preset-tip").strip() == ""
    # A long prompt: the pane says what it waits for, with the time.
    page.fill("input[aria-label='number input for Max tokens']", "8")
    page.keyboard.press("Tab")
    page.click("#run-button")
    page.wait_for_function(
        "() => document.querySelector('#baseline-pane').innerText"
        ".includes('Processing the prompt')",
        timeout=RUN_TIMEOUT_MS,
    )
    waiting = page.inner_text("#baseline-pane")
    assert "characters" in waiting and "long prompt" in waiting
    # Then the engine's own progress: tokens done of the prompt's, and the time left.
    page.wait_for_function(
        "() => /Processing the prompt: [0-9,]+ of [0-9,]+ tokens, about [0-9]+ (s|min) left/"
        ".test(document.querySelector('#baseline-pane').innerText)",
        timeout=RUN_TIMEOUT_MS,
    )
    page.click("#stop-button")
    page.wait_for_function(
        "() => document.querySelector('#run-status').innerText.startsWith('Stopped')",
        timeout=RUN_TIMEOUT_MS,
    )
    # A prompt longer than the model's context window is refused before any pass, with
    # its token count and the window, and no stale pane text.
    page.fill("#prompt-box textarea", "word " * 9000)
    page.click("#run-button")
    page.wait_for_selector("#run-status .sp-status-error", timeout=120_000)
    refusal = page.inner_text("#run-status")
    assert "tokens" in refusal and "context window" in refusal and "shorten" in refusal
    assert "Processing the prompt" not in page.inner_text("#baseline-pane")
    # The URL backend says how to allow typed URLs.
    page.get_by_label(BACKEND_KINDS["url"]).check()
    page.wait_for_selector("#server-url", state="visible")
    assert "--allow-url" in page.inner_text("#server-url")
    page.click("#run-button")
    # The context-window refusal above is an error too: wait for this run's own.
    page.wait_for_function(
        "() => document.querySelector('#run-status .sp-status-error')"
        "?.innerText.includes('--allow-url')",
        timeout=60_000,
    )
    assert page.spconsole.problems() == []
    page.close()


def choose_preset_in(page: Any, category: str, name: str) -> None:
    page.click("#preset-category input")
    page.get_by_role("option", name=category, exact=True).click()
    choose_preset(page, name)


def method_options(page: Any) -> list[str]:
    """The labels the method picker offers now."""
    page.click("#method input")
    page.wait_for_selector("[role='option']")
    labels = [
        " ".join(text.replace("✓", "").split())
        for text in page.locator("[role='option']").all_inner_texts()
    ]
    page.keyboard.press("Escape")
    return labels


def test_methods_offered_follow_the_backend(app_url: str, browser: Any) -> None:
    page = open_page(browser, app_url, DESKTOP, color_scheme="light")
    local = [METHOD_LABELS["ngram"], METHOD_LABELS["suffix"]]  # no draft pairs a packaged model
    assert method_options(page) == local
    hint = "#slider-temperature .info-text"
    assert "may part" in page.inner_text(hint)  # the default exactness, Distribution
    page.get_by_label(EXACT_LABELS["bitwise"], exact=True).check()
    page.wait_for_function(
        f"() => document.querySelector({hint!r}).innerText.includes('same text')"
    )

    page.get_by_label(BACKEND_KINDS["managed"]).check()
    page.wait_for_selector("#exactness", state="hidden")  # llama-server has no such policy
    assert method_options(page) == [METHOD_LABELS["ngram"]]
    assert "may part" in page.inner_text(hint)
    page.get_by_label(BACKEND_KINDS["url"]).check()
    page.wait_for_function(
        "(label) => document.querySelector('#method input').value === label",
        arg=METHOD_LABELS["server"],
    )
    assert method_options(page) == [
        METHOD_LABELS[m] for m in ("server", "ngram", "eagle", "eagle3", "mtp")
    ]
    page.get_by_label(BACKEND_KINDS["local"]).check()
    page.wait_for_selector("#exactness", state="visible")
    assert method_options(page) == local
    assert page.spconsole.problems() == []
    page.close()


def test_run_is_disabled_while_its_comparison_runs(app_url: str, browser: Any) -> None:
    page = open_page(browser, app_url, DESKTOP, color_scheme="light")
    box = page.locator("#prompt-box textarea")
    # A prompt the model answers at length (it counts). With ", and nothing else." it
    # answers one sentence: on an engine already loaded, that run ended before Stop.
    box.fill("Count from 1 to 400, one number per line.")
    page.fill("input[aria-label='number input for Max tokens']", "600")
    page.keyboard.press("Tab")
    page.click("#run-button")
    page.wait_for_selector("#run-status .sp-status-running", timeout=RUN_TIMEOUT_MS)
    run = page.locator("#run-button")
    assert run.is_disabled() and run.inner_text().startswith("Running")
    box.press("Control+Enter")  # the shortcut presses the same, disabled, button
    page.wait_for_timeout(1000)
    assert page.locator("#run-status .sp-status-queued").count() == 0
    page.click("#stop-button")
    # Run comes back however the run ends: one that ended on its own fails here, at once.
    page.wait_for_function(
        "() => !document.querySelector('#run-button').disabled", timeout=RUN_TIMEOUT_MS
    )
    assert page.inner_text("#run-status").startswith("Stopped")
    assert run.inner_text() == "Run"
    assert page.spconsole.problems() == []
    page.close()


def test_a_failed_run_clears_the_results_before_it(app_url: str, browser: Any) -> None:
    page = open_page(browser, app_url, DESKTOP, color_scheme="light")
    page.fill("input[aria-label='number input for Max tokens']", "8")
    page.keyboard.press("Tab")
    run_to_the_end(page)
    assert page.locator("#baseline-pane .sp-placeholder").count() == 0
    assert page.locator("#timeline-chart polyline[data-side]").count() == 2
    page.get_by_text("Structured output", exact=True).click()
    page.click("#json-schema .cm-content")
    page.keyboard.type('{"type": ')
    page.click("#run-button")
    page.wait_for_selector("#run-status .sp-status-error", timeout=60_000)
    assert "JSON schema is not valid JSON" in page.inner_text("#run-status")
    for side in ("baseline", "speculative"):  # the last run's texts are gone
        assert page.locator(f"#{side}-pane .sp-placeholder").count() == 1
    assert page.locator("#timeline-chart polyline[data-side]").count() == 0
    assert page.locator("#acceptance-chart rect.sp-bar").count() == 0
    values = page.locator("#speedup-cards .sp-card-value").all_inner_texts()
    assert values and not any("×" in value for value in values)  # no figure left standing
    page.wait_for_function("() => !document.querySelector('#run-button').disabled")
    assert page.spconsole.problems() == []
    page.close()


# Every header of the History table: its text's box and lines, its cell's box.
HISTORY_HEADERS = """() => [...document.querySelectorAll('#history-table thead th')].map((th) => {
  const text = th.querySelector('.header-content span') || th;
  const range = document.createRange();
  range.selectNodeContents(text);
  const lines = new Set([...range.getClientRects()].map((r) => Math.round(r.top))).size;
  const cell = th.getBoundingClientRect(), box = text.getBoundingClientRect();
  return {text: text.textContent.trim(), lines, left: cell.left, right: cell.right,
    textRight: box.right, cut: text.scrollWidth - text.clientWidth};
})"""


def test_history_is_readable_at_phone_width(app_url: str, browser: Any) -> None:
    page = open_page(browser, app_url, PHONE, is_mobile=True, has_touch=True)
    page.click("#settings-sidebar .toggle-button")
    page.wait_for_selector("#settings-sidebar.open")
    page.fill("input[aria-label='number input for Max tokens']", "8")
    page.keyboard.press("Tab")
    page.click("#settings-sidebar .toggle-button")
    page.wait_for_selector("#settings-sidebar:not(.open)")
    run_to_the_end(page)
    page.locator("#history-table").scroll_into_view_if_needed()
    headers = page.evaluate(HISTORY_HEADERS)
    assert [h["text"] for h in headers] == list(TABLE_HEADERS)
    for header, following in itertools.pairwise(headers):
        assert header["right"] <= following["left"] + 1, (header, following)  # no overlap
    for header in headers:
        assert header["cut"] <= 0 and header["textRight"] <= header["right"] + 1, header
        assert header["lines"] <= len(header["text"].split()), header  # never inside a word
    # The table scrolls sideways in its box; the page itself does not.
    assert page.evaluate("() => document.documentElement.scrollWidth") <= PHONE["width"]
    save_screenshot(page, "playground-phone-history.png")
    assert page.spconsole.problems() == []
    page.close()


def card(page: Any, title: str) -> Any:
    """The speedup card whose title is ``title``."""
    return page.locator(
        "#speedup-cards .sp-card", has=page.locator(f".sp-card-title:text-is('{title}')")
    )


def prediction_rows(page: Any) -> dict[str, list[str]]:
    """The hardware panel's rows: profile -> [r, speedup] as shown."""
    rows = page.locator("#hardware-prediction tbody tr")
    return {
        row.get_attribute("data-profile"): [
            row.locator(".sp-predict-r").inner_text().strip(),
            row.locator(".sp-predict-value span").inner_text().strip(),
        ]
        for row in rows.all()
    }


def type_rate(page: Any, field: str, value: str) -> None:
    page.fill(f"#hardware-{field} input", value)
    page.keyboard.press("Tab")  # the field commits its value


def test_numbers_a_user_can_trust_and_what_they_buy_elsewhere(
    one_thread_app_url: str, browser: Any, verify_delay: VerifyDelay
) -> None:
    """Issue 34 on a real local-engine run: the expected card's formula and inputs, one
    acceptance figure in card and table, a run slowed on purpose flagged with its reason,
    and the hardware panel predicting, then updating on typed rates without a new run."""
    page = open_page(browser, one_thread_app_url, DESKTOP, color_scheme="light")
    page.fill("input[aria-label='number input for Max tokens']", "48")
    page.keyboard.press("Tab")
    # The default timing (interleaved on the local engine): this app's two engines share
    # the process's one engine thread, which advances each stream one step per read, so
    # the sides take turns and each is timed over its own steps.
    run_to_the_end(page)
    assert "interleaved timing" in (card(page, "Measured speedup").text_content() or "")

    # Item 1: the expected figure names its formula and shows its inputs.
    expected = card(page, "Expected speedup").text_content() or ""
    assert "S = T / (1 + (r + c) × d)" in expected
    for name in ("T = ", "d = ", "r = ", "c = ", "k = "):
        assert name in expected, expected
    # Item 6: one acceptance figure, the same in the card and the table (one run).
    acceptance = card(page, "Acceptance")
    assert acceptance.locator(".sp-card-value").text_content() == stats_row(page, "Acceptance")[1]
    proposed = stats_row(page, "Proposed draft tokens")[1]
    accepted = stats_row(page, "Accepted draft tokens")[1]
    assert f"{accepted} of {proposed} proposed draft tokens accepted" in (
        acceptance.text_content() or ""
    )
    body = page.inner_text("body")
    assert "α" not in body and "alpha" not in body.lower()
    assert "accepted / proposed draft tokens" in page.inner_text("#acceptance-chart figcaption")
    for element in ("#speedup-cards .sp-card", "#stats-table tbody th"):  # each defined
        titles = page.locator(element).evaluate_all("(els) => els.map((e) => e.title)")
        assert titles and all(titles), (element, titles)

    # Item 4: the prediction beside the measurement, each row with its r and source.
    page.wait_for_selector("#hardware-prediction tbody tr[data-profile='laptop-cpu']")
    rows = prediction_rows(page)
    measured = card(page, "Measured speedup").locator(".sp-card-value").text_content()
    assert rows["measured"][1] == measured
    assert rows["this-machine"][0] != "—" and rows["this-machine"][1].startswith("×")
    for profile in ("laptop-cpu", "desktop-gpu"):
        assert rows[profile][1].startswith("×") and float(rows[profile][0]) >= 0
    panel = page.inner_text("#hardware-prediction")
    assert "a model, not a measurement" in panel and "llama-bench" in panel
    runs_before = len(history_rows(page))
    yours = "#hardware-prediction tr[data-profile='yours'] .sp-predict-r"
    type_rate(page, "pp", "4000")
    type_rate(page, "tg", "100")
    page.wait_for_selector(f"{yours}:text-is('0.02')")  # (512 * 100 / 4000 - 1) / 511
    type_rate(page, "tg", "-5")
    page.wait_for_selector("#hardware-prediction .sp-predict-error:has-text('positive number')")
    assert page.locator(yours).count() == 0
    type_rate(page, "tg", "200")
    page.wait_for_selector(f"{yours}:text-is('0.05')")  # new rates, a new figure
    assert prediction_rows(page)["yours"][1].startswith("×")
    assert len(history_rows(page)) == runs_before  # typing ran nothing
    checks = [
        (".sp-predict-source", TEXT, TEXT_RATIO),
        (".sp-predict-value span", TEXT, TEXT_RATIO),
        ("#hardware-prediction .sp-note", TEXT, TEXT_RATIO),
    ]
    results = page.evaluate(CONTRASTS, checks)
    assert [r for r in results if "ratio" not in r or r["ratio"] < r["minimum"]] == []
    page.evaluate("() => document.activeElement && document.activeElement.blur()")
    page.locator("#speedup-cards").scroll_into_view_if_needed()
    page.evaluate(
        "() => window.scrollBy(0, document.querySelector('#speedup-cards')"
        ".getBoundingClientRect().top - 8)"
    )
    save_screenshot(page, "playground-prediction.png")
    page.set_viewport_size(PHONE)
    if page.locator("#settings-sidebar.open").count():
        page.click("#settings-sidebar .toggle-button")  # at phone width it covers the page
        page.wait_for_selector("#settings-sidebar:not(.open)")
    page.wait_for_timeout(500)
    assert page.evaluate("() => document.documentElement.scrollWidth") <= PHONE["width"]
    page.evaluate(
        "() => window.scrollBy(0, document.querySelector('#hardware-prediction')"
        ".getBoundingClientRect().top - 8)"
    )
    save_screenshot(page, "playground-prediction-phone.png")
    page.set_viewport_size(DESKTOP)

    # Item 5: a run slowed on purpose (every pass that checks a draft sleeps 1 s, as if
    # another process held the core: one such pass outweighs the CPU of the 48 tokens) is
    # flagged, with the reason, everywhere it shows.
    verify_delay.seconds = 1.0
    try:
        run_to_the_end(page)
    finally:
        verify_delay.seconds = 0.0
    share = stats_row(page, "CPU share")[1]
    status = page.locator("#run-status .sp-status-flagged")
    assert status.count() == 1, (page.inner_text("#run-status"), share)
    assert "Flagged:" in status.inner_text()
    flagged = card(page, "Measured speedup")
    assert "sp-card-warn" in (flagged.get_attribute("class") or "")
    assert "Flagged:" in (flagged.text_content() or "")
    reasons = page.inner_text("#speedup-cards .sp-findings")
    assert "decoding process got" in reasons or "what this run's steps" in reasons, reasons
    assert "flagged" in history_rows(page)[0]
    assert page.spconsole.problems() == []
    page.close()
