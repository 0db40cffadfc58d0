"""Hostile inputs: every case must fail with exit status 2 and one line naming the
culprit, with no traceback, no file written, and nothing of the user's deleted or changed.

Each case runs in a fresh copy of a small workspace (a checkpoint, a training run, Garg and
Hugging Face directories, prompts, a user directory, a file and a symlink), with the working
directory inside it, so `--out .` and friends are tried for real.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import GargTransformerModel, build_cfg, write_garg_run

from probe.cli import main
from probe.data.config import TaskConfig
from probe.io.checkpoint import save_model
from probe.io.run_config import RunConfig
from probe.models import build_model

D, N = 3, 8


def _tiny_sweep_recipe(extra: str) -> str:
    return (
        'description = "hostile"\n[prompts]\ncurve = 16\ntrain = 16\nval = 8\ntest = 16\ninduced = 4\n'
        "[[sweeps]]\n" + extra + "\n"
    )


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("hostile-template")
    torch.manual_seed(0)
    cfg = build_cfg(d=D, points=N, steps=2, save_every=1, eval_every=1, log_every=1)
    save_model(build_model(cfg.model).eval(), cfg, root / "ck")
    from probe.training.train import train

    train(cfg, root / "run", progress=False)
    relu = RunConfig(model=cfg.model, task=TaskConfig(name="relu_network", n_dims=D, n_points=N))
    save_model(build_model(relu.model).eval(), relu, root / "relu")
    ref = GargTransformerModel(D, N, 16, 2, 2).eval()
    write_garg_run(root / "garg", ref, D, N, 16, 2, 2)
    from safetensors.torch import save_file

    ref._backbone.save_pretrained(root / "hf")
    save_file({"read_in.weight": ref._read_in.weight.detach().contiguous(), "read_in.bias": ref._read_in.bias.detach(),
               "read_out.weight": ref._read_out.weight.detach().contiguous(),
               "read_out.bias": ref._read_out.bias.detach()}, str(root / "hf" / "icl_head.safetensors"))
    rng = np.random.default_rng(0)
    np.savez(root / "p.npz", xs=rng.standard_normal((4, N, D)).astype(np.float32),
             ys=rng.standard_normal((4, N)).astype(np.float32))
    (root / "userdir").mkdir()
    (root / "userdir" / "notes.txt").write_text("the user's notes")
    (root / "afile.txt").write_text("a user's file")
    os.symlink("userdir", root / "link")
    return root


# ---------------------------------------------------------------------------- case set-ups

def edit_json(path: str, change):
    def setup(ws: Path) -> None:
        data = json.loads((ws / path).read_text())
        change(data)
        (ws / path).write_text(json.dumps(data))
    return setup


def write(path: str, content: str | bytes):
    def setup(ws: Path) -> None:
        target = ws / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content if isinstance(content, bytes) else content.encode())
    return setup


def truncate(path: str, keep: float = 0.5):
    def setup(ws: Path) -> None:
        data = (ws / path).read_bytes()
        (ws / path).write_bytes(data[: int(len(data) * keep)])
    return setup


def weights(change):
    def setup(ws: Path) -> None:
        from safetensors.torch import load_file, save_file

        state = load_file(str(ws / "ck" / "model.safetensors"))
        change(state)
        save_file(state, str(ws / "ck" / "model.safetensors"))
    return setup


def garg_yaml(change):
    def setup(ws: Path) -> None:
        raw = yaml.safe_load((ws / "garg" / "config.yaml").read_text())
        change(raw)
        (ws / "garg" / "config.yaml").write_text(yaml.safe_dump(raw))
    return setup


def prompts(**arrays):
    def setup(ws: Path) -> None:
        np.savez(ws / "bad.npz", **arrays)
    return setup


def fifo(path: str):
    def setup(ws: Path) -> None:
        os.mkfifo(ws / path)
    return setup


class Evil:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def pickled(path: str, obj):
    def setup(ws: Path) -> None:
        import pickle

        (ws / path).write_bytes(pickle.dumps(obj))
    return setup


def torch_saved(path: str, obj):
    def setup(ws: Path) -> None:
        torch.save(obj, ws / path)
    return setup


def both(*setups):
    def setup(ws: Path) -> None:
        for s in setups:
            s(ws)
    return setup


F32 = np.float32
GOOD_XS = np.zeros((2, N, D), F32)
GOOD_YS = np.zeros((2, N), F32)
NAN_XS = GOOD_XS.copy()
NAN_XS[0, 0, 0] = np.nan
INF_YS = GOOD_YS.copy()
INF_YS[1, 2] = np.inf

CASES: list[tuple[str, object, list[str], str]] = []


def case(name: str, argv: list[str], culprit: str, setup=None) -> None:
    CASES.append((name, setup, argv, culprit))


# ---- output policy: every command that writes a directory, against every bad --out
DIR_COMMANDS = {
    "evaluate": ["evaluate", "ck", "--prompts", "8"],
    "readout": ["readout", "ck"],
    "heatmap": ["heatmap", "ck"],
    "span": ["span", "ck"],
    "probes": ["probes", "ck"],
    "report": ["report", "ck"],
    "forgetting": ["forgetting", "ck", "--prompts", "8"],  # a registered analysis's command
}
BAD_OUTS = {
    "cwd": (".", "current directory|contains the input"),
    "input": ("ck", "input itself"),
    "parent-of-input": ("..", "contains the input|current directory"),
    "user-dir": ("userdir", "did not write"),
    "file": ("afile.txt", "existing file"),
    "symlink": ("link", "symbolic link"),
    "under-a-file": ("afile.txt/sub", "is a file"),
}
for cmd, argv in DIR_COMMANDS.items():
    for label, (out, culprit) in BAD_OUTS.items():
        case(f"{cmd}-out-{label}", [*argv, "--out", out], culprit)
    case(f"{cmd}-force-input", [*argv, "--out", "ck", "--force"], "input itself")
for label, out in (("cwd", "."), ("parent", "..")):
    case(f"report-force-{label}-holding-input", ["report", "ck", "--out", out, "--force"], "contains the input")
case("report-compare-is-out", ["report", "ck", "--compare", "garg", "--out", "garg"], "input itself")
case("report-out-is-other-command", ["report", "ck", "--out", "run"], "did not write|train")

case("capture-out-existing-file", ["capture", "ck", "--prompts", "p.npz", "--out", "afile.txt"], "already exists")
case("capture-out-is-prompts", ["capture", "ck", "--prompts", "p.npz", "--out", "p.npz", "--force"], "input itself")
case("capture-out-is-dir", ["capture", "ck", "--prompts", "p.npz", "--out", "userdir", "--force"], "not a regular file")
case("capture-out-symlink", ["capture", "ck", "--prompts", "p.npz", "--out", "link"], "symbolic link")
case("capture-out-under-file", ["capture", "ck", "--prompts", "p.npz", "--out", "afile.txt/a.npz"], "is a file")

case("train-over-run", ["train", "--recipe", "r.toml", "--out", "run"], "already holds a training run",
     write("r.toml", "[train]\nsteps = 2\n"))
case("train-over-checkpoint", ["train", "--recipe", "r.toml", "--out", "ck"], "did not write",
     write("r.toml", "[train]\nsteps = 2\n"))
case("train-over-cwd", ["train", "--recipe", "r.toml", "--out", "."], "current directory",
     write("r.toml", "[train]\nsteps = 2\n"))
case("train-over-file", ["train", "--recipe", "r.toml", "--out", "afile.txt"], "existing file",
     write("r.toml", "[train]\nsteps = 2\n"))
case("train-resume-nothing", ["train", "--out", "userdir", "--resume"], "no train_state.pt")
case("train-resume-symlink", ["train", "--out", "link", "--resume"], "symbolic link")
case("planted-over-run", ["planted", "--algorithm", "gd", "--layers", "2", "--out", "run"], "already holds a training run")
case("planted-over-cwd", ["planted", "--algorithm", "gd", "--layers", "2", "--out", "."], "current directory")
case("planted-over-userdir", ["planted", "--algorithm", "gd", "--layers", "2", "--out", "userdir"], "did not write")
case("planted-over-file", ["planted", "--algorithm", "gd", "--layers", "2", "--out", "afile.txt"], "existing file")

# ---- training recipes and --set
TRAIN = ["train", "--recipe", "r.toml", "--out", "new"]
TR = write("r.toml", "[train]\nsteps = 2\nbatch_size = 4\n")
for override, culprit in [
    ("train.lr=fast", "train.lr must be a number"), ("train.lr=inf", "train.lr must be a finite"),
    ("train.lr=nan", "train.lr must be a finite"), ("train.lr=-1", "train.lr must be > 0"),
    ("task.w_scale=inf", "task.w_scale must be a finite"), ("task.noise_std=-1", "task.noise_std must be >= 0"),
    ("train.batch_size=1e9", r"train.batch_size=1000000000 would need about .* of memory"),  # 1e9 is an integer
    ("train.batch_size=1000000000", "train.batch_size=1000000000"), ("train.steps=0", "train.steps must be an integer >= 1"),
    ("train.steps=2.5", "train.steps must be an integer"), ("model.n_embd=2000000", "memory"),
    ("train.lrr=1", "Did you mean: lr"), ("model.family=cnn", "model.family"), ("task.kappa=0.5", "task.kappa"),
    ("train.min_lr_ratio=2", "min_lr_ratio"), ("model.n_head=3", "divisible"),
    ("task.mixture_weights=[0.5]", "mixture_weights"), ("task.param_mean=nan", "task.param_mean must be a finite"),
]:
    case(f"train-set-{override}", [*TRAIN, "--set", override], culprit, TR)
case("train-set-no-equals", [*TRAIN, "--set", "train.lr"], "must look like section.key=value", TR)
case("train-recipe-missing", ["train", "--recipe", "nope.toml", "--out", "new"], "Recipe file not found")
case("train-recipe-not-utf8", ["train", "--recipe", "bad.toml", "--out", "new"], "not UTF-8",
     write("bad.toml", b"[train]\nsteps = 2 # \xff\xfe\n"))
case("train-recipe-bad-toml", ["train", "--recipe", "bad.toml", "--out", "new"], "not valid TOML",
     write("bad.toml", "[train\nsteps = \n"))
case("train-keep-every-negative", [*TRAIN, "--keep-every", "-1"], "--keep-every", TR)
case("train-lr-above-bound", [*TRAIN, "--set", "train.lr=1e30"], "train.lr must be <= 10", TR)
case("train-labels-overflow-diverges", [*TRAIN, "--set", "task.w_scale=1e20"],
     "diverged at step 0: .* No checkpoint was written", TR)
case("train-device-cuda", [*TRAIN, "--device", "cuda"], "no GPU", TR)
# ---- resume state
case("resume-truncated-state", ["train", "--out", "run", "--resume"], "train_state.pt", truncate("run/train_state.pt"))
case("resume-state-without-keys", ["train", "--out", "run", "--resume"], "not an icl-probe training state",
     torch_saved("run/train_state.pt", {"a": torch.zeros(1)}))
case("resume-state-pickled-code", ["train", "--out", "run", "--resume"], "refused to load",
     pickled("run/train_state.pt", {"optimizer": Evil()}))
case("resume-state-wrong-step-type", ["train", "--out", "run", "--resume"], "train_state.pt",
     torch_saved("run/train_state.pt", {"optimizer": {}, "step": "x", "elapsed": 0.0}))
case("resume-corrupt-config", ["train", "--out", "run", "--resume"], "config.json", write("run/config.json", "{"))

# ---- report recipes
REPORT = ["report", "ck", "--out", "rep"]
for override, culprit in [
    ("prompts.curve=1e12", r"prompts.curve = 1000000000000 on ck would need about .* of memory"),
    ("prompts.curve=1000000000000", "prompts.curve"), ("prompts.test=0", "prompts.test must be an integer >= 1"),
    ("prompts.train=-5", "prompts.train"), ("similarity.bootstrap=0", "similarity.bootstrap"),
    ("probes.max_iter=-1", "probes.max_iter"), ("probes.gtol=nan", "probes.gtol"), ("readout.alphas=[-1.0]", "readout.alphas"),
    ("readout.alphas=[]", "readout.alphas is empty"), ("readout.method=bogus", "readout.method"),
    ("probes.kinds=['cnn']", "probe kind 'cnn'"), ("prompts.queries=-1", "prompts.queries"),
    ("prompts.induced=0", "prompts.induced"), ("forgetting.prompts=0", "forgetting.prompts"),
    ("prompts.seed=x", "prompts.seed must be an integer"), ("similarity.simw=maybe", "similarity.simw must be true or false"),
    ("interventions.kinds=['cut']", "Unknown ablation kind 'cut'"), ("interventions.sites=['q']", "Unknown site 'q'"),
    ("interventions.learners=['ogd']", "Unknown sweep with an iteration axis 'ogd'"),
    ("interventions.prompts=0", "interventions.prompts"), ("interventions.heads=some", "interventions.heads must be true"),
    # settings that run but cannot give a meaningful number
    ("similarity.bootstrap=1", "similarity.bootstrap must be at least 20"),
    ("similarity.bootstrap=19", "similarity.bootstrap must be at least 20"),
    ("prompts.queries=2", "prompts.queries = 2 is fewer than d = 3"),
    ("prompts.tset=3", "prompts: Unknown key 'tset'. Did you mean: test?"),
    # empty lists where a stage needs one value at least (probes: pandas' "No objects to concatenate";
    # sites: a KeyError; ablation kinds: an empty figure)
    ("probes.kinds=[]", "probes.kinds is empty"), ("probes.targets=[]", "probes.targets is empty"),
    ("interventions.sites=[]", "interventions.sites is empty"), ("interventions.kinds=[]", "interventions.kinds is empty"),
    ("steering.targets=[]", "steering.targets is empty"),
]:
    case(f"report-set-{override}", [*REPORT, "--set", override], culprit)
case("report-unknown-flag-after-the-command", [*REPORT, "--bogus"], "icl-probe report: error: unrecognized arguments: --bogus")
for label, sweep, culprit in [
    ("fractional-steps", 'label = "g"\nlearner = "gd"\naxis = "steps"\ngrid = { steps = [2, 2.5] }', "sweep 'g': steps"),
    ("traversal-label", 'label = "../../x"\nlearner = "least_squares"', "sweep label"),
    ("empty-grid", 'label = "g"\nlearner = "gd"\ngrid = { steps = [] }', "grid 'steps' is empty"),
    ("negative-ridge", 'label = "r"\nlearner = "ridge"\ngrid = { lam = [-1.0] }', "lam must be > 0"),
    ("knn-zero", 'label = "k"\nlearner = "knn"\ngrid = { k = [0] }', "k must be an integer >= 1"),
    ("unknown-learner", 'label = "n"\nlearner = "newtn"', "Did you mean: newton"),
    ("unknown-hyper", 'label = "n"\nlearner = "newton"\ngrid = { iters = [1] }', "no hyper-parameter"),
    ("bad-axis", 'label = "n"\nlearner = "newton"\naxis = "steps"', "axis 'steps'"),
    ("string-steps", 'label = "g"\nlearner = "gd"\ngrid = { steps = ["many"] }', "steps must be an integer >= 0, got 'many'"),
    ("nan-eta", 'label = "g"\nlearner = "gd"\ngrid = { eta = [nan] }', "eta must be a finite"),
    ("negative-iterations", 'label = "n"\nlearner = "newton"\ngrid = { iterations = [-1] }', "iterations"),
]:
    case(f"report-sweep-{label}", ["report", "ck", "--recipe", "s.toml", "--out", "rep"], culprit,
         write("s.toml", _tiny_sweep_recipe(sweep)))
case("report-recipe-unknown", [*REPORT, "--recipe", "quik"], "Did you mean: quick")
case("report-recipe-no-sweeps", ["report", "ck", "--recipe", "s.toml", "--out", "rep"], "at least one",
     write("s.toml", "[prompts]\ntest = 16\n"))
case("report-recipe-not-utf8", ["report", "ck", "--recipe", "s.toml", "--out", "rep"], "not UTF-8",
     write("s.toml", b"description = '\xff'\n"))
case("report-device-cuda", [*REPORT, "--device", "cuda"], "no GPU")
case("report-max-memory-words", [*REPORT, "--max-memory", "lots"], "--max-memory must look like")
case("report-max-memory-tiny", [*REPORT, "--max-memory", "1K"], "below 64 MB")
case("report-device-potato", [*REPORT, "--device", "potato"], "not a torch device")
case("report-compare-missing", [*REPORT, "--compare", "nowhere"], "not found")

# ---- evaluate
case("evaluate-param-mean-linear", ["evaluate", "ck", "--param-mean", "0.5"], "ReLU-network tasks only")
case("evaluate-param-mean-nan", ["evaluate", "relu", "--param-mean", "nan"], "param_mean must be a finite")
case("evaluate-mixture-one", ["evaluate", "relu", "--mixture", "0.5"], "mixture_weights")
case("evaluate-mixture-words", ["evaluate", "relu", "--mixture", "a,b"], "--mixture must look like")
case("evaluate-mixture-sum", ["evaluate", "relu", "--mixture", "0.9,0.3"], "summing to 1")
case("evaluate-mixture-inf", ["evaluate", "relu", "--mixture", "inf,0"], "mixture_weights")
case("evaluate-points-zero", ["evaluate", "ck", "--points", "0"], "positive integer")
case("evaluate-prompts-negative", ["evaluate", "ck", "--prompts", "-3"], "argument --prompts: must be an integer >= 1, got -3 \\(recipe key prompts.curve\\)")
case("evaluate-points-beyond", ["evaluate", "ck", "--points", "99"], "exceeds the model")
case("evaluate-unknown-flag", ["evaluate", "ck", "--promts", "3"], "unrecognized arguments")
case("inspect-prompts-huge", ["inspect", "ck", "--prompts", "1000000000"], "error: prompts = 1000000000 would need")

# ---- checkpoints (inspect loads them)
INSPECT = ["inspect", "ck"]
case("ckpt-missing", ["inspect", "nowhere"], "Checkpoint not found")
case("ckpt-empty-dir", ["inspect", "userdir"], "not a checkpoint in any known format")
case("ckpt-invalid-json", INSPECT, "not valid JSON", write("ck/config.json", "{not json"))
case("ckpt-json-not-object", INSPECT, "must hold a JSON object", write("ck/config.json", "[1, 2]"))
case("ckpt-json-not-utf8", INSPECT, "config.json", write("ck/config.json", b"\xff\xfe{}"))
case("ckpt-meta-string", INSPECT, '"meta" must be an object', edit_json("ck/config.json", lambda c: c.update(meta="x")))
case("ckpt-config-not-object", INSPECT, '"config" object', edit_json("ck/config.json", lambda c: c.update(config=3)))
case("ckpt-n-embd-string", INSPECT, "model.n_embd must be", edit_json("ck/config.json", lambda c: c["config"]["model"].update(n_embd="sixteen")))
case("ckpt-n-embd-huge", INSPECT, "config describes a model",
     edit_json("ck/config.json", lambda c: c["config"]["model"].update(n_embd=2_000_000)))
case("ckpt-n-layer-huge", INSPECT, "config describes a model",
     edit_json("ck/config.json", lambda c: c["config"]["model"].update(n_layer=100_000)))
case("ckpt-n-layer-mismatch", INSPECT, "missing keys", edit_json("ck/config.json", lambda c: c["config"]["model"].update(n_layer=3)))
case("ckpt-unknown-key", INSPECT, "Did you mean", edit_json("ck/config.json", lambda c: c["config"]["model"].update(n_embed=16)))
case("ckpt-weights-truncated", INSPECT, "corrupt or truncated", truncate("ck/model.safetensors"))
case("ckpt-weights-missing", INSPECT, "model.safetensors is missing",
     lambda ws: (ws / "ck" / "model.safetensors").unlink())
case("ckpt-weights-nan", INSPECT, "NaN or infinite", weights(lambda s: s["_read_out.weight"].fill_(float("nan"))))
case("ckpt-weights-inf", INSPECT, "NaN or infinite", weights(lambda s: s["_read_in.bias"].fill_(float("inf"))))
case("ckpt-weights-integer", INSPECT, "not floating point",
     weights(lambda s: s.update({"_read_out.bias": s["_read_out.bias"].to(torch.int64)})))
case("ckpt-weights-extra-key", INSPECT, "unexpected keys", weights(lambda s: s.update(extra=torch.zeros(2))))
case("ckpt-weights-wrong-shape", INSPECT, "shape mismatches", weights(lambda s: s.update({"_read_out.bias": torch.zeros(3)})))
case("ckpt-weights-fifo", INSPECT, "model.safetensors", both(lambda ws: (ws / "ck" / "model.safetensors").unlink(),
                                                             fifo("ck/model.safetensors")))
case("garg-training-list", ["inspect", "garg"], "training:. must be a mapping", garg_yaml(lambda r: r.update(training=[1, 2])))
case("garg-no-model-block", ["inspect", "garg"], "no .model:. block", garg_yaml(lambda r: r.pop("model")))
case("garg-model-string", ["inspect", "garg"], "n_embd must be", garg_yaml(lambda r: r["model"].update(n_embd="x")))
case("garg-model-missing-key", ["inspect", "garg"], "lacks", garg_yaml(lambda r: r["model"].pop("n_head")))
case("garg-task-list", ["inspect", "garg"], "training.task", garg_yaml(lambda r: r["training"].update(task=[1])))
case("garg-family", ["inspect", "garg"], "not supported", garg_yaml(lambda r: r["model"].update(family="lstm")))
case("garg-yaml-invalid", ["inspect", "garg"], "not valid YAML", write("garg/config.yaml", "model: [\n"))
case("garg-yaml-tag", ["inspect", "garg"], "not valid YAML",
     write("garg/config.yaml", "model: !!python/object/apply:os.system ['touch pwned']\n"))
case("garg-state-truncated", ["inspect", "garg"], "corrupt or truncated", truncate("garg/state.pt"))
case("garg-state-pickle", ["inspect", "garg"], "refused to load", pickled("garg/state.pt", {"model_state_dict": Evil()}))
case("garg-state-not-dict", ["inspect", "garg"], "state dict of tensors", torch_saved("garg/state.pt", [1, 2]))
case("garg-fifo-model-step", ["inspect", "garg"], "neither state.pt nor model",
     both(lambda ws: (ws / "garg" / "state.pt").unlink(), fifo("garg/model_5.pt")))
case("garg-huge-embd", ["inspect", "garg"], "config describes a model", garg_yaml(lambda r: r["model"].update(n_embd=2_000_000)))
case("hf-n-embd-string", ["inspect", "hf"], "invalid GPT-2 config value", edit_json("hf/config.json", lambda c: c.update(n_embd="sixteen")))
case("hf-eps-string", ["inspect", "hf"], "layer_norm_epsilon", edit_json("hf/config.json", lambda c: c.update(layer_norm_epsilon="x")))
case("hf-activation", ["inspect", "hf"], "gelu_new", edit_json("hf/config.json", lambda c: c.update(activation_function="relu")))
case("hf-n-layer-float", ["inspect", "hf"], "invalid GPT-2 config value", edit_json("hf/config.json", lambda c: c.update(n_layer=2.5)))
case("hf-no-head", ["inspect", "hf"], "icl_head", lambda ws: (ws / "hf" / "icl_head.safetensors").unlink())
case("hf-head-corrupt", ["inspect", "hf"], "icl_head.safetensors: not a readable", write("hf/icl_head.safetensors", b""))
case("hf-huge", ["inspect", "hf"], "config describes a model", edit_json("hf/config.json", lambda c: c.update(n_embd=2_000_000, n_head=1)))

# ---- capture prompts
CAP = ["capture", "ck", "--out", "acts.npz", "--prompts"]
case("prompts-missing", [*CAP, "none.npz"], "prompts file not found")
case("prompts-npy", [*CAP, "bad.npy"], "single array", lambda ws: np.save(ws / "bad.npy", GOOD_XS))
case("prompts-corrupt-zip", [*CAP, "bad.npz"], "not a readable .npz", write("bad.npz", b"PK\x03\x04garbage"))
case("prompts-text", [*CAP, "bad.npz"], "not a readable .npz", write("bad.npz", "xs,ys\n1,2\n"))
case("prompts-object-arrays", [*CAP, "bad.npz"], "not a readable .npz",
     lambda ws: np.savez(ws / "bad.npz", xs=np.array([GOOD_XS, None], dtype=object), ys=GOOD_YS))
case("prompts-zero-points", [*CAP, "bad.npz"], "empty axis", prompts(xs=np.zeros((2, 0, D), F32), ys=np.zeros((2, 0), F32)))
case("prompts-zero-batch", [*CAP, "bad.npz"], "empty axis", prompts(xs=np.zeros((0, N, D), F32), ys=np.zeros((0, N), F32)))
case("prompts-wrong-d", [*CAP, "bad.npz"], "d=5", prompts(xs=np.zeros((2, N, 5), F32), ys=GOOD_YS))
case("prompts-too-long", [*CAP, "bad.npz"], "positions for", prompts(xs=np.zeros((2, 99, D), F32), ys=np.zeros((2, 99), F32)))
case("prompts-integer", [*CAP, "bad.npz"], "float arrays", prompts(xs=GOOD_XS.astype(np.int64), ys=GOOD_YS))
case("prompts-nan", [*CAP, "bad.npz"], "NaN or infinite", prompts(xs=NAN_XS, ys=GOOD_YS))
case("prompts-inf", [*CAP, "bad.npz"], "NaN or infinite", prompts(xs=GOOD_XS, ys=INF_YS))
case("prompts-no-ys", [*CAP, "bad.npz"], "missing arrays", prompts(xs=GOOD_XS))
case("prompts-ys-shape", [*CAP, "bad.npz"], "ys must have shape", prompts(xs=GOOD_XS, ys=np.zeros((2, N + 1), F32)))
case("prompts-2d-xs", [*CAP, "bad.npz"], "xs must have shape", prompts(xs=np.zeros((2, N), F32), ys=GOOD_YS))
case("prompts-fifo", [*CAP, "f.npz"], "not a regular file", fifo("f.npz"))
case("capture-batch-zero", ["capture", "ck", "--prompts", "p.npz", "--out", "a.npz", "--batch-size", "0"], "positive integer")
case("capture-unknown-hook", ["capture", "ck", "--prompts", "p.npz", "--out", "a.npz", "--hooks", "blocks.9.nope"], "unknown hook")

# ---- planted
PL = ["planted", "--algorithm"]
case("planted-huge-layers", [*PL, "gd", "--layers", "100000000", "--out", "pl"], "--layers must be an integer in")
case("planted-layers-float", [*PL, "gd", "--layers", "1e8", "--out", "pl"], "invalid int value")
case("planted-zero-layers", [*PL, "gd", "--layers", "0", "--out", "pl"], "--layers must be an integer in")
case("planted-unknown", [*PL, "sgdx", "--layers", "2", "--out", "pl"], "Unknown planted algorithm")
case("planted-step-inf", [*PL, "gd", "--layers", "2", "--step-size", "inf", "--out", "pl"], "finite")
case("planted-step-unstable", [*PL, "gd", "--layers", "2", "--step-size", "10", "--out", "pl"], "unstable")
case("planted-alpha-nan", [*PL, "newton", "--layers", "5", "--alpha", "nan", "--out", "pl"], "finite")
case("planted-newton-shallow", [*PL, "newton", "--layers", "2", "--out", "pl"], "at least 3 layers")
case("planted-dims-zero", [*PL, "gd", "--layers", "2", "--dims", "0", "--out", "pl"], "positive integer")
case("planted-dims-huge", [*PL, "gd", "--layers", "2", "--dims", "100000", "--out", "pl"], "--dims must be")

# ---- layer commands' flags
case("readout-bootstrap-zero", ["readout", "ck", "--out", "o", "--bootstrap", "0"], "argument --bootstrap: must be an integer >= 1, got 0 \\(recipe key similarity.bootstrap\\)")
case("heatmap-unknown-sweep", ["heatmap", "ck", "--out", "o", "--learners", "newtn"], "Did you mean: newton")
case("heatmap-queries-negative", ["heatmap", "ck", "--out", "o", "--queries", "-2"], "argument --queries: must be an integer >= 0, got -2 \\(recipe key prompts.queries\\)")
case("probes-prefix-beyond", ["probes", "ck", "--out", "o", "--prefixes", "99"], r"probes.prefixes must lie in 1..7 .* got \[99\]")
case("report-probe-prefix-beyond", ["report", "ck", "--out", "o", "--set", "probes.prefixes=[8]"], r"probes.prefixes must lie in 1..7")
case("probes-alphas-nan", ["probes", "ck", "--out", "o", "--alphas", "nan"], "probes.alphas")
case("probes-alphas-negative", ["probes", "ck", "--out", "o", "--alphas", "-1"], "probes.alphas")
case("unknown-command", ["frobnicate"], "invalid choice")

# ---- interventions
case("ablate-over-cwd", ["ablate", "ck", "--out", "."], "contains the input ck")
case("ablate-kind-unknown", ["ablate", "ck", "--out", "o", "--kinds", "cut"], "argument --kinds: Unknown ablation kind 'cut'. Known: mean, skip, zero")
case("ablate-prompts-zero", ["ablate", "ck", "--out", "o", "--prompts", "0"], "argument --prompts: must be an integer >= 1, got 0 \\(recipe key interventions.prompts\\)")
case("patch-map-missing", ["patch", "ck", "--out", "o", "--map-from", "nope.csv"], "--map-from nope.csv: no such file")
case("patch-map-wrong-table", ["patch", "ck", "--out", "o", "--map-from", "m.csv"], "needs columns sweep, metric",
     write("m.csv", "a,b\n1,2\n"))
case("patch-query-beyond", ["patch", "ck", "--out", "o", "--query", "99"], "--query must lie in 1..7")
# no example before the query: nothing for a patch to restore (every restored share was 0/0, then a pandas ValueError)
case("patch-query-zero", ["patch", "ck", "--out", "o", "--query", "0"], "argument --query: must be an integer >= 1, got 0 \\(recipe key interventions.query\\)")
case("patch-learner-unknown", ["patch", "ck", "--out", "o", "--learners", "newtn"], "Did you mean: newton")
case("patch-over-input", ["patch", "ck", "--out", "ck"], "input itself")


# ---- --force writes only names icl-probe owns, and every input is protected
FORCE_OWN = {"evaluate": "icl_error.csv", "readout": "readout.csv", "heatmap": "best_match.csv", "span": "span.png",
             "probes": "probes.csv", "report": "index.html"}
for cmd, name in FORCE_OWN.items():
    case(f"{cmd}-force-over-a-users-{name}", [*DIR_COMMANDS[cmd], "--out", "userdir", "--force"],
         f"holds {re.escape(name)}, which icl-probe did not write", write(f"userdir/{name}", "the user's"))
case("planted-force-over-a-users-checkpoint", [*PL, "gd", "--layers", "2", "--out", "userdir", "--force"],
     "holds config.json, which icl-probe did not write", write("userdir/config.json", "{}"))
case("ablate-force-over-a-users-summary", ["ablate", "ck", "--out", "userdir", "--force"],
     "holds interventions_summary.json", write("userdir/interventions_summary.json", "{}"))
STUDY_TOML = 'checkpoints = ["ck"]\nanalyses = ["evaluate"]\nevaluate_prompts = 8\n'
case("study-force-over-a-users-index", ["study", "st.toml", "--out", "userdir", "--force"],
     "holds index.html, which icl-probe did not write", both(write("st.toml", STUDY_TOML), write("userdir/index.html", "x")))
case("study-out-holds-its-checkpoints", ["study", "st.toml", "--out", ".", "--force"], "contains the input .*ck",
     write("st.toml", STUDY_TOML))
case("patch-force-deleting-its-map", ["patch", "ck", "--out", "userdir", "--force", "--map-from", "userdir/bm.csv"],
     "contains the input userdir/bm.csv", write("userdir/bm.csv", "sweep,metric\n"))
case("capture-force-over-the-inputs-weights", ["capture", "ck", "--prompts", "p.npz", "--out", "ck/model.safetensors",
                                               "--force"], "is a file of the input ck")


# ---- bounded parsing: deep nesting, alias bombs, huge files
DEEP_TOML = "x = " + "[" * 5000 + "]" * 5000 + "\n"
case("recipe-deeply-nested", ["report", "ck", "--recipe", "deep.toml", "--out", "rep"], "deep.toml: recipe is nested",
     write("deep.toml", DEEP_TOML))
case("recipe-huge", ["report", "ck", "--recipe", "huge.toml", "--out", "rep"], r"huge.toml: recipe is 5.0 MiB",
     write("huge.toml", "# " + "x" * (5 << 20) + "\n"))
case("config-json-deeply-nested", ["inspect", "ck"], "config.json: config.json is nested",
     write("ck/config.json", "[" * 100000 + "]" * 100000))
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n" for p, c in zip("abcdefgh", "bcdefghi"))
case("study-glob-over-the-file-system", ["study", "glob.toml", "--out", "st"], "matches more than 256 paths",
     write("glob.toml", 'checkpoints = ["/*/*/*"]\nanalyses = ["evaluate"]\n'))
for override, culprit in (("prompts=1000000000", "study prompts = 1000000000 with 12 queries on ck would need"),
                          ("evaluate_prompts=1000000000", "evaluate_prompts = 1000000000 on ck would need .*; lower evaluate_prompts$"),
                          ("queries=100000000", "with 100000000 queries")):
    case(f"study-set-{override.split('=')[0]}-huge", ["study", "st.toml", "--out", "st", "--set", override], culprit,
         write("st.toml", STUDY_TOML.replace('["evaluate"]', '["evaluate", "spd_ilw"]')
               + '[[compare]]\nlabel = "ls"\nlearner = "least_squares"\n'))
# ---- trust round 4
HUGE_SEED = str(10**20)
case("evaluate-seed-above-2^63", ["evaluate", "ck", "--prompts", "8", "--seed", HUGE_SEED, "--out", "ev"],
     r"argument --seed: must be an integer in 0..2\^63-1, got \d+ \(recipe key prompts.seed\)")
case("report-seed-above-2^63", ["report", "ck", "--out", "rep", "--set", f"prompts.seed={HUGE_SEED}"], "prompts.seed")
case("train-seed-above-2^63", ["train", "--recipe", "r.toml", "--out", "new", "--set", f"train.seed={HUGE_SEED}"],
     "train.seed", write("r.toml", "[train]\nsteps = 2\n"))
case("heatmap-learners-without-names", ["heatmap", "ck", "--out", "hm", "--learners"], "--learners")
case("garg-yaml-alias-bomb", ["inspect", "garg"], "anchors and aliases are not accepted", write("garg/config.yaml", BOMB))
case("garg-yaml-deep", ["inspect", "garg"], "config.yaml: config.yaml is nested",
     write("garg/config.yaml", "model: " + "[" * 3000 + "]" * 3000 + "\n"))


# ---- affordability: refused before any work or output, naming the knob (probe/core/budget.py)
BIG = "1000000000"
case("afford-ablate-bootstrap", ["ablate", "ck", "--out", "o", "--bootstrap", BIG], r"^icl-probe ablate: error: bootstrap = 1000000000 on ck would need about [\d.]+ [GTP]B of memory")
case("afford-evaluate-prompts", ["evaluate", "ck", "--out", "o", "--prompts", BIG], "prompts.curve = 1000000000 on ck would need")
case("afford-ablate-prompts", ["ablate", "ck", "--out", "o", "--prompts", BIG], "interventions.prompts = 1000000000")
case("afford-patch-prompts", ["patch", "ck", "--out", "o", "--prompts", BIG], "interventions.patch_prompts = 1000000000")
case("afford-probes-hidden", ["probes", "ck", "--out", "o", "--hidden", "100000000"], "probes.hidden = 100000000")
case("afford-report-bootstrap", ["report", "ck", "--out", "o", "--set", f"similarity.bootstrap={BIG}"],
     "similarity.bootstrap = 1000000000 on ck would need")
case("afford-heatmap-queries", ["heatmap", "ck", "--out", "o", "--queries", "1000000"], "prompts.queries = 1000000")
case("afford-order-permutations", ["order", "ck", "--out", "o", "--set", "order.permutations=100000000"],
     "order.permutations = 100000000")
case("afford-planted-layers", ["planted", "--algorithm", "adam", "--layers", "10000", "--out", "o"],
     "planted adam model with 10000 layers .* would need about .* of memory")
case("afford-work-limit", ["--max-work", "1e6", "evaluate", "ck", "--out", "o", "--prompts", "8"],
     r"makes this need about .* floating-point operations.*limit of 1\.0e\+06.*--max-work 1e")
case("afford-bad-max-work", ["--max-work", "-5", "evaluate", "ck", "--out", "o", "--prompts", "8"], "--max-work must be a positive")


def _study_with_shift(shift: str):
    def setup(ws: Path) -> None:
        (ws / "shift.toml").write_text(
            'description = "s"\ncheckpoints = ["ck"]\nanalyses = ["evaluate"]\nx = "n_layer"\nevaluate_prompts = 16\n'
            f'[[shifts]]\nlabel = "bad"\n{shift}\n'
        )

    return setup


case("study-shift-typo", ["study", "shift.toml", "--out", "o"], "shift 'bad': Unknown task field 'noise_stdd'. Did you mean: noise_std",
     setup=_study_with_shift("noise_stdd = 0.5"))
case("study-shift-bad-value", ["study", "shift.toml", "--out", "o"], r"shift 'bad': task.noise_std must be >= 0",
     setup=_study_with_shift("noise_std = -0.5"))


def _forged_npz(ws: Path) -> None:
    """An .npz whose xs header claims 984 GB but holds 100 bytes."""
    import io
    import zipfile

    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(head, {"descr": "<f4", "fortran_order": False, "shape": (300000000, 41, 20)})
    ys = io.BytesIO()
    np.save(ys, np.zeros((4, N), np.float32))
    with zipfile.ZipFile(ws / "forged.npz", "w") as z:
        z.writestr("xs.npy", head.getvalue() + b"\0" * 100)
        z.writestr("ys.npy", ys.getvalue())


case("afford-npz-header", ["capture", "ck", "--prompts", "forged.npz", "--out", "o"],
     r"array xs claims shape \(300000000, 41, 20\).*but holds", setup=_forged_npz)


def _tree(root: Path) -> dict[str, str]:
    """Every path under `root` with what would show a change: a link's target, a file's inode, size
    and modification time in nanoseconds (any write sets it), a directory's or special file's kind."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_symlink():
            out[str(p.relative_to(root))] = "link->" + os.readlink(p)
        elif p.is_file():
            info = p.stat()
            out[str(p.relative_to(root))] = f"file {info.st_ino} {info.st_size} {info.st_mtime_ns}"
        elif p.is_dir():
            out[str(p.relative_to(root)) + "/"] = "dir"
        else:
            out[str(p.relative_to(root))] = "special"
    return out


def test_there_are_enough_cases():
    assert len(CASES) + len(API_CASES) >= 150


@pytest.mark.parametrize("name,setup,argv,culprit", CASES, ids=[c[0] for c in CASES])
def test_hostile_cli(name, setup, argv, culprit, template, tmp_path, monkeypatch, capsys):
    ws = tmp_path / "ws"
    shutil.copytree(template, ws, symlinks=True)
    if setup is not None:
        setup(ws)
    monkeypatch.chdir(ws)
    before = _tree(tmp_path)  # the workspace and everything beside it
    try:
        rc = main(["-q", *argv])
    except SystemExit as exit_:
        rc = exit_.code
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith(("WARNING", "INFO"))]
    assert rc == 2, err
    assert "Traceback" not in err
    assert len(lines) == 1, err
    import re

    assert re.search(culprit, lines[0]), lines[0]
    after = _tree(tmp_path)
    changed = sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))
    assert not changed, f"files were written, changed or deleted: {changed}"
    assert not (ws / "pwned").exists()


# ---------------------------------------------------------------------------- the Python API

def _api(fn_name):
    def call():
        import probe.learners as L
        from probe.capture import capture
        from probe.io.formats import load_checkpoint

        return {"run_learner": L.run_learner, "capture": capture, "load_checkpoint": load_checkpoint}[fn_name]
    return call


xs_np, ys_np = np.random.default_rng(1).standard_normal((3, N, D)), np.random.default_rng(2).standard_normal((3, N))
API_CASES = [
    ("gd-fractional-steps", "run_learner", ("gd", xs_np, ys_np), {"steps": [2, 2.5]}, "steps must be an integer"),
    ("gd-negative-steps", "run_learner", ("gd", xs_np, ys_np), {"steps": [-1]}, "steps must be an integer >= 0"),
    ("gd-empty-grid", "run_learner", ("gd", xs_np, ys_np), {"steps": []}, "is empty"),
    ("gd-eta-inf", "run_learner", ("gd", xs_np, ys_np), {"eta": [float("inf")]}, "finite"),
    ("ridge-negative", "run_learner", ("ridge", xs_np, ys_np), {"lam": [-1.0]}, "lam must be > 0"),
    ("ridge-zero", "run_learner", ("ridge", xs_np, ys_np), {"lam": [0.0]}, "lam must be > 0"),
    ("knn-zero", "run_learner", ("knn", xs_np, ys_np), {"k": [0]}, "k must be an integer >= 1"),
    ("knn-negative", "run_learner", ("knn", xs_np, ys_np), {"k": [-3]}, "k must be"),
    ("newton-bad-alpha", "run_learner", ("newton", xs_np, ys_np), {"alpha": ["huge"]}, "alpha='huge'"),
    ("newton-iterations-float", "run_learner", ("newton", xs_np, ys_np), {"iterations": [1.5]}, "iterations"),
    ("lbfgs-memory-zero", "run_learner", ("lbfgs", xs_np, ys_np), {"memory": 0}, "memory"),
    ("sgd-batch-zero", "run_learner", ("sgd", xs_np, ys_np), {"batch_size": [0]}, "batch_size"),
    ("adam-beta-one", "run_learner", ("adam", xs_np, ys_np), {"beta1": 1.0}, "beta1"),
    ("learner-nan-prompts", "run_learner", ("least_squares", np.where(xs_np > 2, np.nan, xs_np), ys_np), {}, "NaN"),
    ("learner-inf-y", "run_learner", ("least_squares", xs_np, np.full_like(ys_np, np.inf)), {}, "NaN or infinite"),
    ("learner-d-zero", "run_learner", ("least_squares", np.zeros((2, N, 0)), np.zeros((2, N))), {}, "empty axis"),
    ("learner-2d", "run_learner", ("least_squares", np.zeros((2, N)), np.zeros((2, N))), {}, "xs must have shape"),
    ("learner-list", "run_learner", ("least_squares", [[1.0]], [1.0]), {}, "torch tensor or numpy array"),
    ("learner-int", "run_learner", ("least_squares", np.zeros((2, N, D), int), np.zeros((2, N))), {}, "must hold floats"),
    ("learner-unknown", "run_learner", ("newtn", xs_np, ys_np), {}, "Did you mean"),
    ("load-missing", "load_checkpoint", ("/nonexistent/ckpt",), {}, "not found"),
    ("newton-iterations-huge", "run_learner", ("newton", xs_np, ys_np), {"iterations": [10**9]},
     r"learner.newton.iterations = 1000000000 makes this need .*work_limit"),
    ("cg-iterations-huge", "run_learner", ("cg", xs_np, ys_np), {"iterations": [10**9]}, "learner.cg.iterations"),
    ("sgd-steps-huge", "run_learner", ("sgd", xs_np, ys_np), {"steps": [10**9]}, "learner.sgd.steps"),
    ("relu-gd-steps-huge", "run_learner", ("relu_gd", xs_np, ys_np), {"steps": [10**9]}, "learner.relu_gd.steps"),
]


@pytest.mark.parametrize("name,fn,args,kwargs,culprit", API_CASES, ids=[c[0] for c in API_CASES])
def test_hostile_api(name, fn, args, kwargs, culprit):
    from probe.core.errors import ProbeError

    with pytest.raises(ProbeError, match=culprit):
        _api(fn)()(*args, **kwargs)


@pytest.mark.parametrize("kwargs,culprit", [
    ({"batch_size": -1}, "batch_size must be an integer >= 1"), ({"batch_size": 0}, "batch_size"),
    ({"batch_size": 2.5}, "batch_size"), ({"device": "cuda"}, "no GPU"), ({"device": "potato"}, "not a torch device"),
    ({"positions": [99]}, "positions must be .* token indices in 0..15, got \\[99\\]"),
    ({"positions": "bogus"}, "positions must be \"all\", \"x\" or token indices"), ({"positions": []}, "positions"),
    ({"positions": [True]}, "positions"), ({"positions": [[0], [0, 1]]}, "positions"), ({"positions": [0.5]}, "positions"),
])
def test_hostile_capture_api(kwargs, culprit, template):
    from probe.capture import capture
    from probe.core.errors import ProbeError
    from probe.io.formats import load_checkpoint

    model = load_checkpoint(template / "ck").model
    with pytest.raises(ProbeError, match=culprit):
        capture(model, xs_np.astype(np.float32), ys_np.astype(np.float32), **kwargs)


def test_hostile_model_arguments_of_the_python_api(template):
    """Something that is not a model, where the Python API expects one: one ProbeError saying what to
    pass instead, from capture, analyse_layers and probe_study alike; SimW with fewer
    fresh queries than d is refused, not scored."""
    from probe.analysis.pipeline import LayerSettings, analyse_layers
    from probe.analysis.probe_study import ProbeSettings, probe_study
    from probe.capture import capture
    from probe.core.errors import ProbeError
    from probe.core.settings import PromptSettings
    from probe.io.formats import load_checkpoint

    ckpt = load_checkpoint(template / "ck")
    xs, ys = xs_np.astype(np.float32), ys_np.astype(np.float32)
    meta = build_model(RunConfig().model.__class__(n_dims=D, n_positions=N, n_embd=16, n_layer=2, n_head=2)).to("meta")
    for model, culprit in ((ckpt, r"pass its \.model"), (str(template / "ck"), "load_checkpoint\\(path\\)\\.model"),
                           (torch.nn.Linear(2, 2), "lacks n_dims"), (meta, "meta device")):
        with pytest.raises(ProbeError, match=culprit):
            capture(model, xs, ys)
    for call in (lambda: analyse_layers(ckpt, ckpt.config.task, LayerSettings()),
                 lambda: probe_study(ckpt, ckpt.config.task, ProbeSettings())):
        with pytest.raises(ProbeError, match=r"pass its \.model"):
            call()
    few = LayerSettings(PromptSettings(train=16, val=8, test=16, induced=4, queries=D - 1))
    with pytest.raises(ProbeError, match=r"^prompts.queries = 2 is fewer than d = 3: .* need prompts.queries >= d \(0 means 4 d; or similarity.simw = false\)"):
        analyse_layers(ckpt.model, ckpt.config.task, few)


def test_capture_accepts_numpy_and_matches_tensors(template):
    from probe.capture import capture
    from probe.io.formats import load_checkpoint

    model = load_checkpoint(template / "ck").model
    a = capture(model, xs_np.astype(np.float32), ys_np.astype(np.float32), backend="native")
    b = capture(model, torch.as_tensor(xs_np, dtype=torch.float32), torch.as_tensor(ys_np, dtype=torch.float32),
                backend="native")
    np.testing.assert_array_equal(a.pred, b.pred)


def test_a_garg_run_without_its_config_is_named_not_a_file_error(template, tmp_path):
    from probe.core.errors import ProbeError
    from probe.io.formats import load_checkpoint

    run = tmp_path / "garg"
    shutil.copytree(template / "garg", run)
    (run / "config.yaml").unlink()
    with pytest.raises(ProbeError, match="no config.yaml; a Garg et al. run directory holds"):
        load_checkpoint(run, format="garg")


def test_closed_form_gd_steps_are_not_counted_as_work_and_the_limit_can_be_raised():
    """GD's step counts are evaluated in closed form (no loop): 10^9 steps are affordable. A work
    limit is raised for a block of API calls, and restored after it."""
    import probe.core.budget as B
    from probe.core.errors import ConfigError
    from probe.learners import run_learner

    result = run_learner("gd", xs_np, ys_np, steps=[10**9])
    assert np.isfinite(result.preds.numpy()).all()
    with B.work_limit(1e3), pytest.raises(ConfigError, match=r"learner.newton.iterations = 5 makes this need"):
        run_learner("newton", xs_np, ys_np, iterations=[5])
    assert B.max_work() == B.DEFAULT_MAX_WORK
    with B.work_limit(1e30):
        run_learner("newton", xs_np, ys_np, iterations=[5])


def test_ridge_readout_at_alpha_zero_on_collinear_features_is_least_squares():
    """alpha = 0 with a duplicated feature: a singular system, answered (as scikit-learn's
    LinearRegression does) by the minimum-norm least-squares solution instead of a LinAlgError."""
    from sklearn.linear_model import LinearRegression

    from probe.analysis.readout import RidgeReadout

    rng = np.random.default_rng(0)
    x = rng.standard_normal((50, 6))
    x[:, 5] = x[:, 4]
    y = x[:, :2].sum(1) + x[:, 4] + 0.1 * rng.standard_normal(50)
    ours = RidgeReadout(alpha=0.0).fit(x, y)
    ref = LinearRegression().fit(x, y)
    np.testing.assert_allclose(ours.predict(x), ref.predict(x), atol=1e-8)
    assert ours.coef_[4] == pytest.approx(ours.coef_[5], abs=1e-8)  # minimum norm splits the duplicate evenly
