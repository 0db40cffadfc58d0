"""Every size knob of the report's recipe goes through the up-front estimate (probe/core/budget.py):
set to 10^9, each is refused before any work with a message naming it; the fields
that are not sizes are listed with the reason."""

import copy
import dataclasses
import re

import pytest
from conftest import REPO

from probe.api import recipe as load_recipe
from probe.core.errors import ConfigError
from probe.core.resources import default_checkpoint
from probe.io.formats import load_checkpoint
from probe.reporting.build import check_report_size

NOT_SIZES = {
    "prompts.seed": "a seed",
    "prompts.induced": "a cap: of the test prompts, at most prompts.test are used (prompts.test is the size)",
    "spectral.min_count": "a threshold: directions a bin needs to be kept",
    "interventions.max_positions": "a cap: at most the prompt's 2n tokens are patched",
    "interventions.max_queries": "a cap: at most the prompt's n queries are checked",
}
NEEDS = {"readout.finetune_steps": ("readout", "method", "adam"), "steering.train_prompts": ("steering", "enabled", True),
         "steering.test_prompts": ("steering", "enabled", True)}


def _int_knobs(recipe) -> list[str]:
    """Every integer field of every section, built-in or of a registered analysis (recipe.stages)."""
    out = []
    sections = [(f.name, getattr(recipe, f.name)) for f in dataclasses.fields(recipe)] + list(recipe.stages.items())
    for name, settings in sections:
        if not dataclasses.is_dataclass(settings):
            continue
        for f in dataclasses.fields(settings):
            value = getattr(settings, f.name)
            if isinstance(value, int) and not isinstance(value, bool):
                out.append(f"{name}.{f.name}")
    return out


KNOBS = _int_knobs(load_recipe("quick"))


def test_the_enumeration_sees_the_knobs_and_its_exemptions_exist():
    assert {"prompts.train", "probes.hidden", "spectral.bins", "order.permutations", "token_probes.test"} <= set(KNOBS)
    assert set(NOT_SIZES) <= set(KNOBS) and set(NEEDS) <= set(KNOBS)


@pytest.mark.parametrize("knob", [k for k in KNOBS if k not in NOT_SIZES])
def test_a_huge_knob_is_refused_up_front_by_name(knob):
    ckpt = load_checkpoint(default_checkpoint())
    recipe = copy.deepcopy(load_recipe("quick"))
    check_report_size(ckpt, recipe)  # the quick recipe itself is affordable
    if knob in NEEDS:
        section, key, value = NEEDS[knob]
        setattr(getattr(recipe, section), key, value)
    section, key = knob.split(".")
    setattr(getattr(recipe, section), key, 10**9)
    with pytest.raises(ConfigError, match=re.escape(knob)):
        check_report_size(ckpt, recipe)


@pytest.mark.parametrize("knob", sorted(NOT_SIZES))
def test_a_field_that_is_not_a_size_costs_nothing_more_when_huge(knob):
    ckpt = load_checkpoint(default_checkpoint())
    recipe = copy.deepcopy(load_recipe("quick"))
    section, key = knob.split(".")
    setattr(getattr(recipe, section), key, 10**9)
    check_report_size(ckpt, recipe)


def test_the_report_counts_the_order_stage_as_the_stage_does():
    """The order stage runs the permuted prompts once per prefix t, on its first t + 1 points; the
    report's up-front estimate once counted one forward, so a report could pass its check and be
    refused at the order stage."""
    from probe.analysis.order import ORDER_BOOTSTRAP, order_estimates
    from probe.io.formats import load_checkpoint
    from probe.models.sizes import shape_of
    from probe.reporting.build import report_estimates
    from probe.reporting.recipe import resolve_recipe

    ckpt = load_checkpoint(REPO / "checkpoints" / "gpt2-default")
    recipe = resolve_recipe("quick")
    o, shape, n = recipe.order, shape_of(ckpt.model), ckpt.config.task.n_points
    prefixes = o.prefixes_for(shape.d, n)
    assert len(prefixes) == 3
    up_front = {e.knob: e for e in report_estimates(ckpt, recipe)}
    at_stage = {e.knob: e for e in order_estimates(shape, n, o.prompts, o.permutations, prefixes, len(o.learners), ORDER_BOOTSTRAP)}
    assert up_front["order.permutations"].flop == at_stage["order.permutations"].flop
    one_forward = order_estimates(shape, n, o.prompts, o.permutations, [n - 1], len(o.learners), ORDER_BOOTSTRAP)
    assert prefixes == [4, 9, 15] and n == 16  # 5, 10 and 16 of the 16 points: 31 / 16 forwards
    assert at_stage["order.permutations"].flop == pytest.approx(31 / 16 * one_forward[1].flop)


def test_the_report_and_the_layer_analyses_count_the_same_layer_budget():
    """The layer budget had two definitions: the report's counted the 'adam' read-out's fine-tune
    but not the spectral instrument, `analyse_layers`'s check the reverse. Now both come from
    `layer_costs`: the report's layers and spectral stages together hold exactly its estimates."""
    from probe.analysis.pipeline import LayerSettings, layer_costs
    from probe.models.sizes import shape_of
    from probe.reporting.build import report_estimates
    from probe.reporting.recipe import resolve_recipe

    ckpt = load_checkpoint(REPO / "checkpoints" / "gpt2-default")
    recipe = resolve_recipe("quick")
    recipe = dataclasses.replace(recipe, readout=dataclasses.replace(recipe.readout, method="adam"))
    settings = LayerSettings.from_recipe(recipe)
    theirs = {e.knob: e for e in layer_costs(shape_of(ckpt.model), ckpt.config.task, settings, recipe.sweeps, True)}
    assert {"readout.finetune_steps", "spectral.bins", "prompts.queries"} <= set(theirs)
    up_front = {(e.knob, e.flop, e.nbytes) for e in report_estimates(ckpt, recipe)}  # a knob may recur across stages
    for knob, e in theirs.items():
        assert (knob, e.flop, e.nbytes) in up_front, knob


def test_the_causal_checks_estimate_counts_the_resumed_runs_by_hand():
    """L = 2 blocks, 3 points (6 tokens), kinds zero/mean/skip without heads, 5 positions (tokens up
    to the query), 3 queries: ablations 2 + 3 per layer x (L + 1) / 2 = 6.5 forwards; patching 2 +
    1.5 x (1 + ... + 5) / 6 = 5.75, and per checked map 2 + 1.5 x 3 / 6 = 2.75: 11.25. A planted
    construction, with no resumed path: 2 + 3 x 2 = 8 and (L + 1) x (5 + 3) = 24."""
    from probe.core import budget
    from probe.interventions.pipeline import InterventionSettings

    settings = InterventionSettings(prompts=10, patch_prompts=4, kinds=("zero", "mean", "skip"), heads=False)
    for planted, ablation, patch in ((False, 6.5, 11.25), (True, 8, 24)):
        shape = budget.Shape(2, 8, 2, planted=planted)
        got = {e.knob: e.flop for e in budget.intervention_estimates(shape, 3, settings, n_boot=0)}
        assert got["interventions.prompts"] == pytest.approx(budget.forward_cost(shape, 10, 3)[0] * ablation)
        assert got["interventions.patch_prompts"] == pytest.approx(budget.forward_cost(shape, 4, 3)[0] * patch)
