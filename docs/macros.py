"""mkdocs-macros: numbers read from the committed reports, and the CLI reference from the parser.

`{{ number("gpt2-default-quick", "table1.sime.newton.similarity", ".3f") }}` reads
reports/gpt2-default-quick/summary.json, so a regenerated report updates the pages
(tests/test_docs.py checks every quoted path resolves). `{{ cli_reference() }}` is the argparse
help of every command."""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def lookup(report: str, path: str):
    """The value at a dotted path (list indices as numbers) of reports/<report>/summary.json."""
    value = json.loads((REPO / "reports" / report / "summary.json").read_text())
    for key in path.split("."):
        value = value[int(key)] if isinstance(value, list) else value[key]
    return value


def number(report: str, path: str, fmt: str = ".3f") -> str:
    value = lookup(report, path)
    return format(value, fmt) if isinstance(value, (int, float)) else str(value)


def table1(report: str) -> str:
    """Table 1 of a report as a markdown table: family, best k, SimE with its 90% interval."""
    rows = ["| learner family | best k | SimE (final layer) [90% interval] |", "|---|---|---|"]
    for family, e in lookup(report, "table1.sime").items():
        rows.append(f"| {family} | {e['k']} | {e['similarity']:.3f} [{e['ci_low']:.3f}, {e['ci_high']:.3f}] |")
    return "\n".join(rows)


def verdict(report: str, a: str, b: str, metric: str = "sime", claim: str = "final layer (Table 1)") -> str:
    """A paired verdict of a report in words: difference [interval], resolution, verdict."""
    for v in lookup(report, "verdicts"):
        if v["claim"] == claim and v["metric"] == metric and {v["a"], v["b"]} == {a, b}:
            return (
                f"{v['a']} - {v['b']} = {v['difference']:+.4f} [{v['ci_low']:+.4f}, {v['ci_high']:+.4f}], "
                f"resolution {v['resolution']:.4f}: **{v['verdict']}**"
            )
    raise KeyError(f"{report}: no {claim} verdict on {metric} between {a} and {b}")


def spectral(report: str) -> str:
    """A report's spectral instrument per layer as a markdown table: verdict, local exponent p
    [90% interval] in the best family's own bin variable, and the share that is not a filter."""
    block = lookup(report, "spectral")
    fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    rows = ["| layer | verdict | p [90% interval] (variable) | not a filter |", "|---|---|---|---|"]
    for i, layer in enumerate(block["layer"]):
        fits = block["by_variable"][block["variable"][i]]
        rows.append(
            f"| {layer} | {block['verdict'][i]} | {fmt(block['p'][i])} [{fmt(block['p_low'][i])}, "
            f"{fmt(block['p_high'][i])}] ({block['variable'][i]}) | {fits['non_filter'][i]:.3f} |"
        )
    return "\n".join(rows)


def evidence(report: str, question: int | None = None) -> str:
    """A report's evidence tables (summary.json `evidence`) as markdown: per question, one row per
    instrument (what it favours, its effect, whether it was validated on known answers) and the
    consolidated answer with its contradictions."""
    out = []
    for i, q in enumerate(lookup(report, "evidence")):
        if question is not None and i != question:
            continue
        rows = [f"**{q['a']} or {q['b']}?**", "", "| instrument | favours | effect | validated |", "|---|---|---|---|"]
        for r in q["rows"]:
            effect = r["effect"].replace("|", "/")
            rows.append(
                f"| {r['instrument']} | {r['favours'] or 'neither'} | {effect} | {'yes' if r['validated_on'] else 'no'} |"
            )
        rows += ["", f"Consolidated answer: **{q['answer_words']}**."]
        if q.get("contradictions"):
            rows.append(" Contradictions: " + "; ".join(q["contradictions"]) + ".")
        out.append("\n".join(rows))
    return "\n\n".join(out)


def shift_table(checkpoint: str) -> str:
    """A checkpoint's evaluations under Garg et al.'s prompt shifts (checkpoints/<name>/eval-shift-*/
    icl_error.csv, `icl-probe evaluate --shift`) as markdown: per shift, error / d at 2d+1 examples (or
    the last number of examples the shift defines) for the model with its 90% band and the baselines."""
    import csv

    folder = REPO / "checkpoints" / checkpoint
    d = json.loads((folder / "config.json").read_text())["config"]["task"]["n_dims"]
    rows = ["| shift | t | model [90% band] | least squares | 3-NN | averaging |", "|---|---|---|---|---|---|"]
    for path in sorted(folder.glob("eval-shift-*/icl_error.csv")):
        with path.open() as f:
            table = [r for r in csv.DictReader(f) if r["model"] not in ("", "nan")]
        row = next((r for r in table if int(r["n_examples"]) == 2 * d + 1), table[-1])
        g = lambda k: f"{float(row[k]):.3g}"  # noqa: E731
        rows.append(
            f"| {row['shift']} | {row['n_examples']} | {g('model')} [{g('model_lo')}, {g('model_hi')}] | "
            f"{g('least_squares')} | {g('knn3')} | {g('averaging')} |"
        )
    return "\n".join(rows)


def track_table(checkpoint: str) -> str:
    """Which learner family a checkpoint tracks under each shift (eval-shift-*/shift_tracking.csv and
    its answer, shift_tracking.json: `icl-probe evaluate --shift S --track`) as markdown."""
    import csv

    folder = REPO / "checkpoints" / checkpoint
    rows = [
        "| shift | tracks (member matched in distribution) | relative distance | runner-up, paired 90% interval "
        "(criterion) | model diverged | diverged, not with the model |",
        "|---|---|---|---|---|---|",
    ]
    for path in sorted(folder.glob("eval-shift-*/shift_tracking.csv")):
        record = json.loads(path.with_suffix(".json").read_text())
        with path.open() as f:
            table = {r["family"]: r for r in csv.DictReader(f)}
        first = table[record["tracks"]]
        apart = "apart" if record["separable"] else "not separable"
        over = ", ".join(f for f, r in table.items() if float(r["mismatch"]) > 0) or "none"
        relative = f"{float(first['relative_distance']):.3g}" if first["relative_distance"] else "-"
        tracks = f"{record['tracks']} ({first['matched']})"
        if record.get("tie"):  # nearest by a margin that names nothing
            tracks = f"none (nearest {tracks}: {record['tie']})"
        rows.append(
            f"| {first['shift']} | {tracks} | {relative} | "
            f"{record['runner_up']}: {apart} ({record['ci_low']:.2g} to {record['ci_high']:.2g}, "
            f"{record['criterion']}) | {float(first['model_diverged']):.0%} | {over} |"
        )
    return "\n".join(rows)


def token_table(report: str) -> str:
    """A report's token probes (summary.json `token_probes`) as markdown: per token kind and target
    (Newton's M_k x over k), the floor (x alone; at a column token, its e_j), and the layer with the
    largest gain over it."""
    block = lookup(report, "token_probes")
    rows = [
        "| token | target | floor R^2 | best layer (k) | R^2 [90%] | gain over the floor [90%] |",
        "|---|---|---|---|---|---|",
    ]
    groups: dict[tuple[str, str], list] = {}
    for s in block["series"]:
        groups.setdefault((s["token"], s["target"].split("[")[0]), []).append(s)
    for (token, target), series in groups.items():
        s, i = max(((s, i) for s in series for i in range(len(block["layer"]))), key=lambda p: p[0]["gain"][p[1]])
        k = "" if s["iterations"] is None else f" (k = {s['iterations']})"
        rows.append(
            f"| {token} | {target} | {s['floor_r2']:.2f} | {block['layer'][i]}{k} | {s['r2'][i]:.2f} "
            f"[{s['r2_low'][i]:.2f}, {s['r2_high'][i]:.2f}] | {s['gain'][i]:+.2f} "
            f"[{s['gain_low'][i]:+.2f}, {s['gain_high'][i]:+.2f}] |"
        )
    return "\n".join(rows)


def number_csv(checkpoint: str, shift: str, fmt: str = ".3g") -> str:
    """The model's error / d at 2d+1 examples under one shift (eval-shift-<shift>/icl_error.csv)."""
    import csv

    folder = REPO / "checkpoints" / checkpoint
    d = json.loads((folder / "config.json").read_text())["config"]["task"]["n_dims"]
    with (folder / f"eval-shift-{shift}" / "icl_error.csv").open() as f:
        row = next(r for r in csv.DictReader(f) if int(r["n_examples"]) == 2 * d + 1)
    return format(float(row["model"]), fmt)


FIGURES: set[str] = set()


def figure_html(path: str, alt: str, page_url: str) -> str:
    """A committed report's figure on a page (copied into the site's figures/ when it is built),
    linked relative to the page so the site also works opened from disk."""
    if not (REPO / path).is_file():
        raise FileNotFoundError(f"{path}: no such figure in the repository")
    FIGURES.add(path)
    prefix = "../" * page_url.count("/")
    return f'<img alt="{alt}" src="{prefix}figures/{path.replace("/", "__")}" style="max-width: 100%">'


def all_modules() -> str:
    """A mkdocstrings block for every module of the package (its public names, from the docstrings)."""
    import pkgutil

    import probe

    names = ["probe"] + sorted(m.name for m in pkgutil.walk_packages(probe.__path__, "probe.") if ".cli" not in m.name)
    blocks = [
        f"## `{name}`\n\n::: {name}\n    options:\n      show_root_heading: false\n      show_submodules: false\n"
        for name in names
        if name != "probe.__main__"
    ]
    return "\n".join(blocks)


def cli_reference() -> str:
    from probe.cli import COMMANDS, build_parser

    parser = build_parser()
    out = ["Generated from the argument parser (`probe/cli/`); `icl-probe COMMAND --help` prints the same.\n"]
    choices = parser._defaults["commands"]  # every subcommand: the hand-written and the stages' own
    for name in [*COMMANDS, *(name for name in choices if name not in COMMANDS)]:
        out.append(f"## `icl-probe {name}`\n\n```text\n{choices[name].format_help().rstrip()}\n```\n")
    return "\n".join(out)


def define_env(env) -> None:
    for macro in (number, table1, verdict, spectral, evidence, shift_table, track_table, token_table, number_csv, cli_reference, all_modules):
        env.macro(macro)

    @env.macro
    def figure(path: str, alt: str) -> str:
        return figure_html(path, alt, env.page.url)


def on_post_build(env) -> None:
    """Copy the figures the pages showed, and summary.json's schema, into the site."""
    import shutil

    shutil.copyfile(
        REPO / "probe" / "reporting" / "summary.schema.json", Path(env.conf["site_dir"]) / "summary.schema.json"
    )
    target = Path(env.conf["site_dir"]) / "figures"
    target.mkdir(parents=True, exist_ok=True)
    for path in sorted(FIGURES):
        shutil.copyfile(REPO / path, target / path.replace("/", "__"))
