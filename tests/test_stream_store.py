"""The report's stream store (probe/capture/stream_store.py): the probe study keeps the model's
float64 streams of the probes' prompts and the token probes read them back instead of running the
model, with the numbers of each stage alone, bit for bit; a stage keeps only the prompt sets a later
stage reads; other prompts or a full disk fall back to running the model; a report plans its
readers from the stages that will run and are not cached."""

from collections import namedtuple

import pytest
import torch

from probe.analysis.probe_study import ProbeSettings, probe_study
from probe.analysis.token_probes import TokenTarget, token_probe_study
from probe.capture import stream_store
from probe.capture.stream_store import StreamStore
from probe.capture.streams import LayerStreams, by_position_streams
from probe.core.seeds import Stream
from probe.reporting.cache import StageCache

TRAIN, TEST = Stream.PROBE_TRAIN, Stream.PROBE_TEST


@pytest.fixture(scope="module")
def tiny():
    from conftest import build_cfg

    from probe.models import build_model

    cfg = build_cfg(layers=2)
    torch.manual_seed(0)
    return build_model(cfg.model).eval(), cfg.task


def _model_never_runs(monkeypatch, model) -> None:
    """Every way LayerStreams computes a boundary raises (its float64 copy has the same class)."""

    def refuse(*args, **kwargs):
        raise AssertionError("the model ran: the stream should have been read from the store")

    monkeypatch.setattr(type(model), "embed_prompts", refuse)
    monkeypatch.setattr(type(model), "resume", refuse)


def _prompts(seed: int, n: int = 10):
    xs = torch.randn(n, 8, 3, generator=torch.Generator().manual_seed(seed))
    return xs, xs.sum(-1)


def test_token_probes_read_the_probe_studys_streams_without_running_the_model(tiny, monkeypatch):
    model, task = tiny
    settings = ProbeSettings(prompts=24, max_iter=30, hidden=8, targets=("xty",), prefixes=(2, 5), controls=False)
    targets = [TokenTarget("sx"), TokenTarget("w_ols")]
    alone = probe_study(model, task, settings, n_test=12, n_boot=20)
    tokens_alone = token_probe_study(model, task, targets, n_train=24, n_test=12, n_boot=20)

    sets = {(TRAIN, 24), (TEST, 12)}
    with StreamStore({"probes": sets, "token_probes": sets}) as store:
        assert store.reader("probes").later == sets and store.reader("token_probes").later == set()
        shared = probe_study(model, task, settings, n_test=12, n_boot=20, streams=store.reader("probes"))
        kept = sorted(p.name for p in store.root.iterdir())
        assert len(kept) == 2 * 3  # training and test prompts, 3 boundaries each
        with monkeypatch.context() as patched:
            _model_never_runs(patched, model)
            tokens_shared = token_probe_study(
                model, task, targets, n_train=24, n_test=12, n_boot=20, streams=store.reader("token_probes")
            )
        assert sorted(p.name for p in store.root.iterdir()) == kept  # the last reader keeps nothing more
        root = store.root
    assert not root.exists()  # removed when the report's stages are done
    assert shared.equals(alone)
    assert tokens_shared.equals(tokens_alone)


def test_a_reader_keeps_only_the_prompt_sets_a_later_reader_reads(tiny, monkeypatch):
    model, _ = tiny
    xs, ys = _prompts(1)
    lone = StreamStore({"probes": {(TRAIN, 10)}})
    assert lone.reader("token_probes") is None and not lone.reader("probes").share(TRAIN, 10).keep
    LayerStreams(model, xs, ys, share=lone.reader("probes").share(TRAIN, 10))[0:3]
    assert lone.root is None  # nothing written

    store = StreamStore({"probes": {(TRAIN, 10), (TEST, 6)}, "token_probes": {(TRAIN, 10), (TEST, 4)}})
    first = store.reader("probes")
    assert first.share(TRAIN, 10).keep and not first.share(TEST, 6).keep  # the test sets differ
    LayerStreams(model, xs, ys, share=first.share(TRAIN, 10))[0:3]
    other, other_ys = _prompts(2)  # another prompt set under the same counts: its own key, so computed
    streamed = LayerStreams(model, other, other_ys, share=store.reader("token_probes").share(TRAIN, 10))[0:3]
    torch.testing.assert_close(streamed, by_position_streams(model, other, other_ys, dtype=torch.float64))
    with monkeypatch.context() as patched:
        _model_never_runs(patched, model)
        again = LayerStreams(model, xs, ys, share=store.reader("token_probes").share(TRAIN, 10))[0:3]
    torch.testing.assert_close(again, by_position_streams(model, xs, ys, dtype=torch.float64), rtol=0, atol=0)
    store.close()
    assert store.root is None


def test_a_full_disk_stops_the_store_writing_and_the_next_reader_runs_the_model(tiny, monkeypatch, caplog):
    model, _ = tiny
    xs, ys = _prompts(3, 6)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(stream_store.shutil, "disk_usage", lambda path: usage(1 << 40, 1 << 40, 1 << 20))
    with StreamStore({"probes": {(TRAIN, 6)}, "token_probes": {(TRAIN, 6)}}) as store:
        LayerStreams(model, xs, ys, share=store.reader("probes").share(TRAIN, 6))[0:3]
        assert not store.writing and not list(store.root.iterdir())
        assert "too little disk" in caplog.text
        read = LayerStreams(model, xs, ys, share=store.reader("token_probes").share(TRAIN, 6))[0:3]
    torch.testing.assert_close(read, by_position_streams(model, xs, ys, dtype=torch.float64))


def test_a_report_plans_its_readers_from_the_stages_that_run_uncached(ckpt, tmp_path, monkeypatch):
    """The probes and token probes of one report share the prompt sets they both read; a cached
    stage is no reader; the token probes' table is the one they give alone, without a store."""
    import copy

    import probe
    from probe.io.formats import load_checkpoint
    from probe.reporting import build

    planned = []

    class Recording(StreamStore):
        def __init__(self, readers=None):
            super().__init__(readers)
            planned.append(self.readers)

    monkeypatch.setattr(build, "StreamStore", Recording)
    model, recipe = load_checkpoint(ckpt), probe.recipe("smoke")
    recipe.token_probes.prompts, recipe.token_probes.test = recipe.probes.prompts, recipe.prompts.test
    stages, cache = {"probes", "token_probes"}, StageCache(tmp_path / "cache")
    first = build.run_stages(model, recipe, "cpu", cache, False, only=stages)
    sets = frozenset({(TRAIN, 48), (TEST, 48)})
    assert planned[-1] == {"probes": sets, "token_probes": sets}
    alone = build.run_stages(model, recipe, "cpu", StageCache(None), False, only={"token_probes"})
    assert planned[-1] == {"token_probes": sets}
    assert first.tables["token_probes"].equals(alone.tables["token_probes"])
    fewer = copy.deepcopy(recipe)
    fewer.token_probes.targets = ("sx",)
    build.run_stages(model, fewer, "cpu", cache, False, only=stages)
    assert planned[-1] == {"token_probes": sets}  # the probes are cached: nobody to read from


def test_a_cache_holds_only_what_was_written(tmp_path):
    import pandas as pd

    cache = StageCache(tmp_path)
    assert not cache.holds("k") and not StageCache(None).holds("k")
    cache.get_or_run("k", lambda: ({"t": pd.DataFrame({"a": [1]})}, {}))
    assert cache.holds("k")


def test_the_token_probes_estimate_leaves_out_the_forwards_of_streams_the_probe_study_makes():
    """The report's up-front estimate counts the token probes' float64 forwards only for prompt sets
    no earlier stage makes: with the probes on (same prompt sets) none, with them off both."""
    import copy

    import probe
    from probe.core.stages import registered
    from probe.io.formats import load_checkpoint
    from probe.reporting.recipe import adapt_recipe

    ckpt = load_checkpoint("checkpoints/gpt2-default")
    recipe = adapt_recipe(probe.recipe("quick"), ckpt.config)
    stage = registered()["token_probes"]
    flop = lambda r: {e.knob: e.flop for e in stage.estimates(r, ckpt) if e.knob.startswith("token_probes.")}
    shared = flop(recipe)
    assert shared["token_probes.prompts"] == 0 and shared["token_probes.test"] == 0
    alone = copy.deepcopy(recipe)
    alone.probes.enabled = False
    assert flop(alone)["token_probes.prompts"] > 0 and flop(alone)["token_probes.test"] > 0
    other = copy.deepcopy(recipe)
    other.token_probes.test = 128  # the test sets differ: only the training streams are read
    assert flop(other)["token_probes.prompts"] == 0 and flop(other)["token_probes.test"] > 0
