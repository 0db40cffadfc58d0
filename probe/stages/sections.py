"""Page sections a stage writes with macros of its own template in probe/stages/templates/ (the
report's spine: the error curve, the layers and the spectral filter, whose prose and captions are
written out there); every other stage's section is made of its description, tables and figures."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

Sections = tuple[tuple[str, str, str], ...]  # (title, macro, the figure whose presence shows it or "")


def template_page(
    stage: Any,
    template: str,
    sections: Sections,
    block: Any,
    summary: Any,
    figs: dict[str, Path],
    tables: dict[str, Any],
    context: dict[str, Any],
) -> list[tuple[str, str]]:
    """`stage.page` from macros: (title, HTML) for each of `sections` whose figure was drawn, the macro
    of `template` rendered as `{% import template as m with context %}{{ m.macro() }}` would, with the
    page's `context` and its `tables` joined by the stage's own (`stage.tables`)."""
    import markupsafe

    own = {
        **context.get("tables", {}),
        **{k: markupsafe.Markup(v) for k, v in stage.tables(block, summary, tables).items()},
    }
    module = _environment().get_template(template).make_module(vars={**context, "tables": own})
    return [(title, str(getattr(module, macro)())) for title, macro, when in sections if not when or when in figs]


@cache
def _environment():
    import jinja2

    return jinja2.Environment(
        loader=jinja2.PackageLoader("probe.stages", "templates"),
        autoescape=jinja2.select_autoescape(["j2", "html"]),
        keep_trailing_newline=True,
    )
