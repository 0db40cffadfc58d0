"""Check that the built documentation site opens from disk: every internal link (href and src) of
every page resolves to a file, not a directory (file:// shows a directory listing) and not a missing
path; anchors are not checked.

    python scripts/check_site_links.py site      (exit 1 naming each broken link)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

LINK = re.compile(r"""(?:href|src)=["']([^"']+)["']""")


def broken_links(site: Path) -> list[str]:
    """'page: link (why)' for each internal link of the site's HTML pages that is not a file."""
    out = []
    for page in sorted(site.rglob("*.html")):
        for link in LINK.findall(page.read_text(errors="replace")):
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith(("#", "mailto:", "data:", "javascript:")):
                continue
            path = unquote(parts.path)
            if not path:
                continue
            target = (site / path.lstrip("/")) if path.startswith("/") else (page.parent / path)
            if target.is_dir():
                out.append(f"{page.relative_to(site)}: {link} (a directory: opened from disk it lists files)")
            elif not target.exists():
                out.append(f"{page.relative_to(site)}: {link} (missing)")
    return out


def main(argv: list[str]) -> int:
    site = Path(argv[1] if len(argv) > 1 else "site")
    bad = broken_links(site)
    for line in bad:
        print(line, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
