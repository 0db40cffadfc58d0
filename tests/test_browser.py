"""The report opens in a real browser (headless Chromium): every image loads, no console errors."""

import os
import shutil

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None and not os.environ.get("CI"), reason="Chromium not installed (scripts/setup.sh --with-browser)")
def test_report_renders_in_headless_chromium(report, tmp_path):
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
        page.goto((report / "index.html").as_uri())
        page.wait_for_load_state("load")
        images = page.eval_on_selector_all("img", "els => els.map(e => [e.complete, e.naturalWidth])")
        # the answer is visible without scrolling: the findings block with the Newton and GD verdicts
        box = page.locator("#findings").bounding_box()
        verdicts = [page.locator("#findings li", has_text=text).first.bounding_box()
                    for text in ("Layers vs Iterative Newton", "Layers vs GD")]
        # every contents link lands on its section
        landed = []
        for anchor in page.eval_on_selector_all("nav#contents a", "els => els.map(e => e.getAttribute('href'))"):
            page.click(f"nav#contents a[href='{anchor}']")
            page.wait_for_timeout(50)
            top = page.eval_on_selector(anchor, "e => e.getBoundingClientRect().top")
            landed.append((anchor, abs(top) < 5 or page.evaluate("window.innerHeight + window.scrollY >= document.body.scrollHeight - 2")))
            page.evaluate("window.scrollTo(0, 0)")
        page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
        browser.close()
    assert images and all(done and width > 0 for done, width in images)
    assert box is not None and box["y"] < 900
    assert all(v is not None and v["y"] + v["height"] <= 900 for v in verdicts), verdicts
    assert landed and all(ok for _, ok in landed), landed
    assert errors == []
    assert (tmp_path / "report.png").stat().st_size > 10_000
