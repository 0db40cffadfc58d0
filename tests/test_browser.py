"""The report and a study page open in a real browser (headless Chromium): every image loads, the
report's answer block is on the first screen and the findings come before the first figure,
contents links land, no console errors or network requests. Screenshots at three scroll positions
(top, the first figure, the end) go to $ICL_PROBE_ARTEFACTS when set (CI keeps them), else to the
test's temporary folder."""

import os
import shutil
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None and not os.environ.get("CI"),
                                    reason="Chromium not installed (scripts/setup.sh --with-browser)")


def _artefacts(tmp_path):
    where = os.environ.get("ICL_PROBE_ARTEFACTS")
    folder = Path(where) if where else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _open(index, shot, headline_texts, first_screen="#findings"):
    """Load a page; return what the assertions need. `headline_texts` must be visible, inside
    `first_screen`, without scrolling."""
    from playwright.sync_api import sync_playwright

    assert CHROMIUM, "CI must install Chromium (scripts/setup.sh --with-browser)"
    errors = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu",
                                                                     "--disable-background-networking"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on("request", lambda req: errors.append(f"network request {req.url}") if not req.url.startswith(("file:", "data:")) else None)
        page.goto(index.as_uri())
        page.wait_for_load_state("load")
        images = page.eval_on_selector_all("img", "els => els.map(e => [e.complete, e.naturalWidth])")
        box = page.locator("#findings").bounding_box()
        first_figure = page.locator("figure").first.bounding_box()
        # the answer is visible without scrolling
        verdicts = [page.locator(first_screen, has_text=text).first.bounding_box() for text in headline_texts]
        for name, y in (("top", 0), ("first-figure", first_figure["y"] if first_figure else 0), ("end", 10**7)):
            page.evaluate(f"window.scrollTo(0, {y})")
            page.wait_for_timeout(50)
            page.screenshot(path=str(shot.with_name(f"{shot.stem}-{name}.png")))
        page.evaluate("window.scrollTo(0, 0)")
        landed = []
        for anchor in page.eval_on_selector_all("nav#contents a", "els => els.map(e => e.getAttribute('href'))"):
            page.click(f"nav#contents a[href='{anchor}']")
            page.wait_for_timeout(50)
            top = page.eval_on_selector(anchor, "e => e.getBoundingClientRect().top")
            landed.append((anchor, abs(top) < 5 or page.evaluate("window.innerHeight + window.scrollY >= document.body.scrollHeight - 2")))
            page.evaluate("window.scrollTo(0, 0)")
        page.screenshot(path=str(shot), full_page=True)
        browser.close()
    assert images and all(done and width > 0 for done, width in images)
    assert box is not None and box["y"] < 900
    assert first_figure is not None and box["y"] + box["height"] <= first_figure["y"]
    assert all(v is not None and v["y"] < 900 for v in verdicts), verdicts
    assert landed and all(ok for _, ok in landed), landed
    assert errors == []
    assert shot.stat().st_size > 10_000


@needs_chromium
@pytest.mark.slow  # a real browser: end to end
def test_report_renders_in_headless_chromium(report, tmp_path):
    shot = _artefacts(tmp_path) / "report.png"
    _open(report / "index.html", shot, ("Iterative Newton or GD?", "What the layers look like"), "#answer")
    assert all(shot.with_name(f"report-{name}.png").stat().st_size > 10_000 for name in ("top", "first-figure", "end"))


@needs_chromium
@pytest.mark.slow  # a real browser: end to end
def test_study_page_renders_in_headless_chromium(tmp_path):
    from conftest import REPO

    from probe.study.present import rerender
    from probe.study.recipe import resolve_study

    shutil.copytree(REPO / "reports" / "study-depth-noiseless", tmp_path / "s")
    rerender(tmp_path / "s", resolve_study("depth-noiseless"))
    _open(tmp_path / "s" / "index.html", _artefacts(tmp_path) / "study.png", ("Closest learner by SPD",))
