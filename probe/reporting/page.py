"""One look for every page: a report and a study page are both `Page`s rendered by
templates/page.html.j2 (findings first, then contents, then the sections), with one style
sheet, figures linked from figures/ (stored once, as PNG) and a caption under every figure."""

from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ..core.provenance import VERSION as __version__

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
h1{font-size:1.6em} h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
.subtitle{color:#444;margin-top:-.5em}
figure{margin:1em 0} figure img{max-width:100%;border:1px solid #eee}
figcaption{font-size:.9em;color:#555;margin-top:.3em}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0} td,th{border:1px solid #ddd;padding:.25em .5em;text-align:left;vertical-align:top} td.num{text-align:right;white-space:nowrap}
th{background:#f5f5f5} .findings{background:#f0f6ff;padding:.3em 1.2em;border-left:4px solid #58f}
.headline{font-size:1.1em;font-weight:600} .caveats li{color:#8a4b00} nav ol{columns:2;font-size:.95em}
.verdict{background:#f0f6ff;padding:.5em 1em;border-left:3px solid #58f}
.answer{background:#f3fbf3;padding:.3em 1.2em .8em;border-left:4px solid #3a3} .answer table{font-size:.9em;width:100%}
.answer td:first-child{white-space:nowrap;font-weight:600}
code{background:#f3f3f3;padding:0 .2em} .grid{display:flex;flex-wrap:wrap;gap:1em} .grid figure{flex:1 1 45%}
"""


@dataclass
class Section:
    """One <h2> section: a title (may hold <sup>-style markup written by icl-probe) and either HTML
    blocks or the name of a macro of the page's sections template that writes the body."""

    title: str
    parts: list[str] = field(default_factory=list)
    macro: str = ""

    @property
    def plain(self) -> str:
        return re.sub(r"<[^>]+>", "", self.title)

    @property
    def id(self) -> str:
        return re.sub(r"[^a-z0-9]+", "-", self.plain.lower()).strip("-")

    @property
    def body(self) -> str:
        return "\n".join(self.parts)


@dataclass
class Page:
    """What a page says, in reading order: the answer block (answers, layer groups), the findings
    (headline and bullets) and their caveats, then the sections."""

    title: str
    subtitle: str
    findings: list[str]
    sections: list[Section]
    git: str
    headline: str = ""
    caveats: list[str] = field(default_factory=list)
    # the first screen (probe/reporting/answer.py): each question's answer, and what the layers look like
    answers: list = field(default_factory=list)
    layer_groups: list = field(default_factory=list)
    rendered: str = ""  # the git commit that drew this page, where it is not the one of its numbers
    sections_template: str = ""  # a template of macros, one per Section.macro (templates/report.html.j2)
    context: dict = field(default_factory=dict)  # what those macros read

    def render(self) -> str:
        import jinja2
        import markupsafe

        env = jinja2.Environment(
            loader=jinja2.PackageLoader("probe.reporting", "templates"),
            autoescape=jinja2.select_autoescape(["j2", "html"]),
            keep_trailing_newline=True,
        )
        return env.get_template("page.html.j2").render(
            page=self, css=markupsafe.Markup(CSS), version=__version__, markup=markupsafe.Markup, **self.context
        )


def figure(path: Path, alt: str, caption: str) -> str:
    """A figure from figures/ beside index.html, with its caption."""
    src = f"{path.parent.name}/{path.name}"
    return (
        f'<figure><img src="{html.escape(src)}" alt="{html.escape(alt)}">'
        f"<figcaption>{html.escape(caption)}</figcaption></figure>"
    )


# a cell that reads as a number (or a number with its interval): right-aligned; prose stays left-aligned
NUMERIC = re.compile(r"^[-+]?(\d[\d,]*\.?\d*(e[-+]?\d+)?|nan|inf)%?( \[[^\]]*\])?$", re.IGNORECASE)


def _cell(value: object, floatfmt: str, missing: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return missing
    if isinstance(value, float):
        return floatfmt.format(value)
    return str(value)


def table(frame: pd.DataFrame, floatfmt: str = "{:.4f}", missing: dict[str, str] | None = None) -> str:
    """An HTML table: numbers right-aligned, prose left-aligned, and a missing value (NaN, None)
    shown as what it means in its column (`missing`: column -> words; "-" elsewhere)."""
    missing = {**frame.attrs.get("missing", {}), **(missing or {})}  # a stage's frame may carry its own
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    rows = []
    for record in frame.itertuples(index=False, name=None):
        cells = []
        for column, value in zip(frame.columns, record):
            text = _cell(value, floatfmt, missing.get(str(column), "-"))
            kind = ' class="num"' if NUMERIC.match(text) else ""
            cells.append(f"<td{kind}>{html.escape(text)}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return f'<table class="data">\n<thead><tr>{head}</tr></thead>\n<tbody>\n' + "\n".join(rows) + "\n</tbody>\n</table>"
