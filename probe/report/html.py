"""index.html: one page (CSS inline, no scripts, nothing fetched from outside the report) that
links each figure from figures/ (stored once, as PNG), with a caption under every figure and the
tables behind it in data/."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import pandas as pd

from .findings import findings, label
from .page import Page, Section
from .page import figure as _img
from .page import table as _table
from .schema import Interventions, Summary


def _readable(frame: pd.DataFrame) -> pd.DataFrame:
    """Human labels for a best-match-like table: learner and metric names, flags as words."""

    out = frame.copy()
    for col in ("sweep", "learner", "family", "metric"):
        if col in out:
            out[col] = out[col].map(label)
    for col, text in (("degenerate", "not distinguishable from 0"), ("at_grid_end", "at grid end")):
        if col in out:
            out[col] = out[col].map(lambda v, t=text: t if bool(v) else "")
    out = out.drop(columns=[c for c in ("predicts_zero",) if c in out])
    return out.rename(
        columns={
            "zero_similarity": "SimE vs zero predictor",
            "random_similarity": "SimE vs random model",
            "degenerate": "null check",
            "at_grid_end": "grid",
        }
    )


GD_STEP = {"auto": "per-prompt step 1/lambda_max of the loss Hessian ('auto')"}
NEWTON_ALPHA = {
    "spectral": "M_0 = S/||S S^T||_2 ('spectral')",
    "frobenius": "M_0 = S/||S S^T||_F ('frobenius', the paper's code)",
    "paper": "M_0 = 2 S/||S S^T||_2 ('paper', seed 003 eq. 8)",
}


def learner_methods(recipe) -> list[str]:
    """What the GD and Newton sweeps of this recipe actually ran (their grids, not a fixed text)."""
    lines = []
    for sweep in recipe.sweeps:
        grid = sweep.grid
        if sweep.learner == "gd":
            etas = [
                GD_STEP.get(e, str(e)) if isinstance(e, str) else f"fixed step eta = {e:g}"
                for e in grid.get("eta", ["auto"])
            ]
            conv = ", ".join(grid.get("convention", ["paper"]))
            lines.append(
                f"{label(sweep.label)}: {conv} convention (gradient of ||y - Xw||^2/(2t) for 'paper'), "
                + "; ".join(etas)
                + "."
            )
        elif sweep.learner == "newton":
            alphas = [
                NEWTON_ALPHA.get(a, str(a)) if isinstance(a, str) else f"M_0 = {a:g} S/t (fixed alpha)"
                for a in grid.get("alpha", ["spectral"])
            ]
            lines.append(f"{label(sweep.label)}: M_(k+1) = 2 M_k - M_k S M_k with " + "; ".join(alphas) + ".")
    return lines


def _training_rows(ckpt) -> list[tuple[str, Any]]:
    """The training recipe, when the checkpoint records it (icl-probe runs do; Garg's config less)."""
    if ckpt.format != "icl-probe":
        return [("training recipe", f"not recorded in the {ckpt.format} format")]
    tr, cur = ckpt.config.train, ckpt.config.curriculum
    rows = [
        (
            "optimizer",
            f"AdamW lr {tr.lr:g}, {tr.warmup_steps} warm-up steps, {tr.schedule} decay, batch {tr.batch_size}, "
            f"clip {tr.grad_clip:g}, seed {tr.seed}",
        )
    ]
    if cur.dims or cur.points:
        stage = lambda s: "fixed" if s is None else f"{s.start} -> {s.end} (+{s.inc} every {s.interval} steps)"
        rows.append(("curriculum", f"dims {stage(cur.dims)}; points {stage(cur.points)}"))
    if "train_seconds" in ckpt.meta:
        rows.append(("training wall time", f"{ckpt.meta['train_seconds']:.0f} s"))
    return rows


def render_html(built, summary: Summary, figs: dict[str, Path], ckpt, recipe, compare) -> str:
    """The report page (templates/page.html.j2): findings, contents, then the sections."""
    t = built.tables
    sections = [
        _model_card(summary, figs, ckpt),
        _readout_section(summary, figs, recipe, compare),
        _matching_section(t, summary, figs, recipe),
        _table1_section(t, summary, compare),
        *_span_probes_forgetting(t, figs),
        *_causal_section(summary.interventions, figs),
        *_methods_section(summary, ckpt, recipe),
    ]
    items, caveats = findings(summary)
    return Page(
        title=f"icl-probe report: {summary.checkpoint.name} ({recipe.name} recipe)",
        subtitle="",
        findings=items,
        caveats=caveats,
        sections=sections,
        git=str(summary.git_commit),
    ).render()


def _model_card(summary: Summary, figs: dict[str, Path], ckpt) -> Section:
    c = summary.checkpoint
    m = c.model
    card = pd.DataFrame(
        [
            ("format", c.format),
            ("family", m["family"]),
            ("layers", m["n_layer"]),
            ("width", m["n_embd"]),
            ("heads", m["n_head"] if m["family"] == "gpt2" else "-"),
            ("d", m["n_dims"]),
            ("points", m["n_positions"]),
            ("parameters", f"{c.parameters:,}"),
            ("task", f"{c.task['name']} ({c.task['covariance']})"),
            ("trained steps", "unknown" if c.train_step is None else c.train_step),
            ("sha256", c.sha256[:16] + "..."),
        ]
        + _training_rows(ckpt),
        columns=["field", "value"],
    )
    parts = [
        _table(card),
        _img(
            figs["icl_error"],
            "error vs examples",
            "Squared error / d of the model's own predictions against the number of in-context examples "
            "(band: bootstrap 5-95% over prompts), beside least squares, 3-nearest neighbours and averaging; "
            "linear axis (left) and log axis (right).",
        ),
    ]
    if "icl_r2" in figs:
        parts.append(
            _img(
                figs["icl_r2"],
                "R^2 vs examples",
                "R^2 (over prompts) of the model's predictions against the "
                "number of examples, beside training the task's ReLU network directly on each prompt's examples "
                "(last epoch, and best epoch as seed 001 reports), least squares and 3-NN.",
            )
        )
    return Section("Model card", parts)


def _readout_section(summary: Summary, figs: dict[str, Path], recipe, compare) -> Section:
    readout = summary.readout
    ro = pd.DataFrame({"layer": readout.layer, "error / d (mean over t >= 1)": readout.error})
    if readout.error_at_2d1:
        ro["error / d at t = 2d+1"] = readout.error_at_2d1
    parts = [
        f"<p>A fresh linear read-out ({html.escape(recipe.readout.method)}) is fitted on each layer's frozen "
        "residual stream at the x tokens (seed 003 §4.1); layer 0 is the embedding output.</p>",
        _table(ro),
        _img(
            figs["readout"],
            "readout error",
            "Error / d of each layer's retrained read-out against the number of "
            "examples on held-out prompts; the dotted line marks t = d.",
        ),
    ]
    if "compare_readout" in figs:
        parts.append(
            _img(
                figs["compare_readout"],
                "readout comparison",
                f"Mean error / d (examples >= 1) of each layer's retrained read-out for "
                f"{summary.checkpoint.name} and {compare.name}: how much each layer improves on the one "
                "before.",
            )
        )
    return Section("Per-layer readout retraining", parts)


def _matching_section(t: dict[str, pd.DataFrame], summary: Summary, figs: dict[str, Path], recipe) -> Section:
    parts = ["<div class='verdict'>"]
    parts += [f"<p>{html.escape(tr.verdict)}</p>" for label, tr in summary.trend.items() if label != "gd"]
    parts.append("</div>")
    for sweep in recipe.sweeps:
        key = f"heatmap_{sweep.label}"
        if key in figs:
            parts.append(
                _img(
                    figs[key],
                    key,
                    f"SimE (left) and SimW (right, when computed) between every layer (x) and "
                    f"{label(sweep.label)} over its {sweep.axis or 'setting'} (y), on one colour scale; the "
                    "boxed cell is the best match per layer (dashed red: at the grid's end, the true match may "
                    "lie beyond; white cross: not distinguishable from predicting 0).",
                )
            )
    parts.append("<div class='grid'>")
    for sweep in recipe.sweeps:
        key = f"trend_{sweep.label}"
        if key in figs:
            parts.append(
                _img(
                    figs[key],
                    key,
                    f"Best-matching {label(sweep.label)} {sweep.axis} per layer by SimE, "
                    "with its 90% bootstrap interval over prompts.",
                )
            )
    parts.append("</div>")
    best = t["best_match"]
    parts += [
        "<h3>Best matches</h3>",
        "<p><em>not distinguishable from 0</em>: the zero predictor's SimE lies within "
        "the match's interval, or the layer predicts ~0; <em>at grid end</em>: the true match may lie beyond the "
        "grid.</p>",
        _table(_readable(best[best.sweep.isin([s.label for s in recipe.sweeps if s.axis])]), "{:.3f}"),
    ]
    return Section("Layers vs reference learners", parts)


def _table1_section(t: dict[str, pd.DataFrame], summary: Summary, compare) -> Section:
    t1 = _readable(t["table1"]).rename(columns={"similarity": "SimE (final layer)"})
    if compare is not None and "compare_table1" in t:
        other = _readable(t["compare_table1"][["family", "similarity"]]).rename(
            columns={"similarity": f"SimE ({compare.name})"}
        )
        t1 = t1.merge(other, on="family", how="left")
    parts = [_table(t1, "{:.3f}")]
    null = summary.table1.null
    if null:
        parts.append(
            "<p>Null baselines for the final layer (SimE): "
            + "; ".join(f"{html.escape(label(name))} {entry['similarity']:.3f}" for name, entry in null.items())
            + ". A learner that does not beat the zero predictor beyond its interval is marked not distinguishable from 0.</p>"
        )
    return Section("Table 1: final layer against each learner", parts)


def _probe_training(pr: pd.DataFrame) -> list[str]:
    """How the probes trained: early stopping on validation R^2, steps used, the step limit."""
    if "converged" not in pr:
        return []
    own = pr[pr.control == "none"]
    grouped = (
        own.groupby(["target", "kind"])
        .agg(converged=("converged", "mean"), median_steps=("steps", "median"), max_steps=("steps", "max"))
        .reset_index()
    )
    return [
        "<p>Training: each probe stops once its R<sup>2</sup> on held-out validation prompts has not improved "
        "for several evaluations and keeps its best parameters; learning rate and width are chosen per probe on "
        "validation. Share of probes that converged before the step limit, and steps used:</p>",
        _table(grouped, "{:.2f}"),
    ]


def _span_probes_forgetting(t: dict[str, pd.DataFrame], figs: dict[str, Path]) -> list[Section]:
    sections = []
    if "span" in figs:
        caption = (
            "Root-mean-square relative residual of each layer's induced weight vector outside span{x_1..x_t}, "
            "against t; the dashed line is a random vector's sqrt((d-t)/d)."
        )
        sections.append(Section("Span of the examples", [_img(figs["span"], "span test", caption)]))
    if "probes" in figs:
        pr = t["probes"]
        attn = (
            pr[pr.control == "none"].groupby(["target", "kind"])[["y_mass", "last_example_mass"]].mean().reset_index()
        )
        parts = [
            "<p>Attention-pooled probes (seed 002 §5) per layer, prefix and target; targets standardised per "
            "prefix and coordinate with training statistics. Controls: the same probes on a random-weights model "
            "of the same architecture, and on shuffled targets.</p>",
            _img(
                figs["probes"],
                "probes",
                "Held-out R^2 of probes by layer (mean over probed prefixes) for each "
                "target and probe kind, beside both controls.",
            ),
            "<p>Where the probes' attention falls (mean over layers and prefixes):</p>",
            _table(attn, "{:.3f}"),
            *_probe_training(pr),
        ]
        sections.append(Section("Probes for X<sup>T</sup>y and w", parts))
    if "forgetting" in figs:
        caption = (
            "Squared error / d when an earlier example x_i is asked again after n-1 examples, by how long ago it "
            "was seen (seed 003 App. A.4), for the model and reference learners."
        )
        sections.append(Section("Forgetting", [_img(figs["forgetting"], "forgetting", caption)]))
    if "order" in figs:
        caption = (
            "Share of the prediction's variance due to the order of the examples (seed 000, Discussion): "
            "the variance across orderings of the first t examples (same query), averaged over prompts, over the "
            "variance across prompts; per layer for the model (90% bootstrap band over prompts), dashed for "
            "reference learners at the longest prefix. Values below 1e-8 (float round-off of order-free "
            "predictors such as least squares, GD and Newton) are drawn at 1e-8."
        )
        sections.append(Section("Order sensitivity", [_img(figs["order"], "order sensitivity", caption)]))
    if "steering" in figs:
        caption = (
            "Causal probes: at each layer boundary and prefix t, a linear probe of w_OLS (left) or X^T y (right) is "
            "fitted; the first 2t tokens are edited by the smallest change that moves what the probe decodes by a "
            "random delta, and the remaining layers run. Slope of the prediction's move against the move the decoded "
            "quantity implies (x.delta for w_OLS; x.S^+ delta for X^T y, least squares' map), with 90% bootstrap "
            "intervals over prompts; dashed: a random edit of the same size. 1: the layers use what the probe reads; "
            "0: they ignore it."
        )
        sections.append(Section("Causal probes", [_img(figs["steering"], "steering", caption)]))
    return sections


def _methods_section(summary: Summary, ckpt, recipe) -> list[Section]:
    p = recipe.prompts
    methods = [
        "<ul>",
        f"<li>Prompts: {p.curve} for the error curve; {p.train} / {p.val} / {p.test} for read-out training, "
        f"penalty selection and held-out scoring; {p.induced} of the held-out prompts for SimW and the span test, with "
        f"{p.queries or 4 * ckpt.config.task.n_dims} fresh queries per prefix. Seed {p.seed}.</li>",
        f"<li>SimE: cosine of error vectors over positions {'1' if recipe.similarity.include_first else '2'}..n "
        "(seed 003 eq. 9-10). SimW: cosine of induced weights fitted by least squares to query predictions, "
        "averaged over prefixes (eq. 11-12).</li>",
        f"<li>Intervals: percentile bootstrap over prompts, {recipe.similarity.bootstrap} resamples, 90% "
        "(5-95%), for similarities and for the best-matching index itself.</li>",
        *[f"<li>{html.escape(line)}</li>" for line in learner_methods(recipe)],
        "<li>Trend: linear and exponential least-squares fits of the best k against layer over layers l >= 1 "
        "whose best match is neither k = 0 nor the grid's end.</li>",
        f"<li>Recipe, versions and git commit: see summary.json (git {html.escape(str(summary.git_commit))}).</li>",
        "</ul>",
    ]
    grids = pd.DataFrame(
        [{"label": s.label, "learner": s.learner, "axis": s.axis, "grid": json.dumps(s.grid)} for s in recipe.sweeps]
    )
    return [Section("Methods", methods), Section("Grids", [_table(grids)])]


def _causal_section(block: Interventions | None, figs: dict[str, Path]) -> list[Section]:
    """ "Causal checks": ablations, the patching heatmap, iteration-consistent patching."""
    if not block:
        return []
    parts = [
        "<p>Interventions (probe/interventions): TransformerLens hooks, or for GPT-2 models the same edit "
        "applied by resuming the forward pass from the edited layer (equal to the hooks to 1e-5). Correlation "
        "says a layer <em>resembles</em> a learner's iterate; these runs change what a layer writes and "
        "measure the prediction.</p>",
        *_ablation_part(block.ablation, figs),
        *_patching_part(figs),
        *_iteration_part(block, figs),
    ]
    return [Section("Causal checks", parts)]


def _ablation_part(ab: dict | None, figs: dict[str, Path]) -> list[str]:
    if not ab:
        return []
    skip = pd.DataFrame(
        {"layer skipped": ab["skip"]["layer"], f"error / d at t = {ab['n_examples']}": ab["skip"]["error"]}
    )
    parts = [
        f"<h3>Ablations</h3><p>Unablated error / d at t = {ab['n_examples']}: {ab['baseline_error']:.4f}. "
        "Removing one layer's whole residual update (skip):</p>",
        _table(skip, "{:.4f}"),
    ]
    if "ablation" in figs:
        parts.append(
            _img(
                figs["ablation"],
                "ablation",
                "Increase of the error / d over the unablated model when each "
                "head (output z zeroed, or replaced by its mean over held-out prompts), MLP block or whole "
                "layer update is removed, against the number of examples.",
            )
        )
    return parts


def _patching_part(figs: dict[str, Path]) -> list[str]:
    return [
        _img(
            figs[key],
            key,
            f"Activation patching ({key.removeprefix('patching_')}): clean prompts (X, y) and corrupted prompts "
            "(X, y') with a fresh function; the clean activation at one layer and token replaces the "
            "corrupted one, and the cell is the fraction of the clean prediction restored at the final "
            "query (1: fully restored; a ratio of sums over prompts).",
        )
        for key in sorted(k for k in figs if k.startswith("patching_"))
    ]


def _iteration_part(block: Interventions, figs: dict[str, Path]) -> list[str]:
    if not block.iteration:
        return []
    parts = [
        "<h3>Is the layer-to-iteration map causal?</h3>",
        "<p>At boundary l every token before the query is patched from a source run (X, y'); under the map "
        "'boundary l holds the learner after k(l) steps, the blocks above add the remaining steps' the "
        "patched prediction moves by a fraction 1 - sum a_k(l) a_k(L) / sum a_k(L)^2 of the full change, "
        "with a_k the learner's change of prediction from y to y' (probe/interventions/patch.py). "
        "Consistency = observed / expected; the null shuffles the map's iteration counts across layers.</p>",
        "<div class='verdict'>" + "".join(f"<p>{html.escape(v)}</p>" for v in block.verdicts) + "</div>",
    ]
    for learner, entry in block.iteration.items():
        frame = pd.DataFrame({k: entry[k] for k in ("boundary", "k", "observed", "expected", "consistency")})
        parts += [f"<p>{html.escape(learner)}</p>", _table(frame, "{:.3f}")]
    if "iteration_consistency" in figs:
        parts.append(
            _img(
                figs["iteration_consistency"],
                "iteration consistency",
                "Observed fraction of the "
                "source's change after patching each boundary (with its 90% bootstrap interval), beside "
                "the fraction each learner's layer map predicts.",
            )
        )
    return parts
