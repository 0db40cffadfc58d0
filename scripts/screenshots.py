"""Screenshots of the pages a researcher opens first, in headless Chromium (playwright), at three
scroll positions each (top, the first figure, the end): the default report, a study page, and the
docs site opened from disk when its build folder is given. Written to docs/screenshots/ (committed
beside the docs), so a reviewer sees what a browser shows without building anything.

    .venv/bin/python scripts/screenshots.py [SITE_DIR]
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

PAGES = {
    "report": Path("reports/gpt2-default-quick/index.html"),
    "study": Path("reports/study-seeds-default/index.html"),
}
OUT = Path("docs/screenshots")


def shoot(pages: dict[str, Path], out: Path) -> list[Path]:
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        for name, path in pages.items():
            page.goto(path.resolve().as_uri())
            page.wait_for_load_state("load")
            figure = page.locator("figure, img").first
            box = figure.bounding_box() if figure.count() else None
            for where, y in (("top", 0), ("first-figure", box["y"] if box else 450), ("end", 10**7)):
                page.evaluate(f"window.scrollTo(0, {y})")
                page.wait_for_timeout(100)
                shot = out / f"{name}-{where}.png"
                page.screenshot(path=str(shot))
                written.append(shot)
        browser.close()
    return written


if __name__ == "__main__":
    pages = dict(PAGES)
    if len(sys.argv) > 1:
        pages["docs"] = Path(sys.argv[1]) / "index.html"
    for path in shoot(pages, OUT):
        print(path)
