import json
import sys

import pandas as pd
import pytest
from conftest import REPO

from probe.cli import main


def test_train_then_evaluate_from_cli(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["-q", "train", "--recipe", str(REPO / "recipes" / "tiny.toml"), "--set", "train.steps=10",
                 "--out", str(run)]) == 0
    assert main(["-q", "evaluate", str(run), "--prompts", "16", "--out", str(tmp_path / "eval")]) == 0
    out = capsys.readouterr().out
    assert "n_examples" in out and "least_squares" in out and "16 prompts, seed 0; squared error / d" in out
    frame = pd.read_csv(tmp_path / "eval" / "icl_error.csv")
    assert len(frame) == 8 and (tmp_path / "eval" / "icl_error.png").stat().st_size > 1000
    written = json.loads((tmp_path / "eval" / "evaluate_summary.json").read_text())
    assert written["evaluate"]["icl_error"]["model"] == pytest.approx(frame.model.tolist(), rel=1e-12)
    assert written["recipe"]["prompts"]["curve"] == 16 and "options" not in written


def test_bad_inputs_exit_nonzero_with_one_message(tmp_path, capsys):
    assert main(["evaluate", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert "error: Checkpoint not found" in err and "Traceback" not in err
    bad = tmp_path / "bad.toml"
    bad.write_text("[model]\nn_layers = 3\n")
    assert main(["train", "--recipe", str(bad), "--out", str(tmp_path / "x")]) == 2
    assert "Did you mean: n_layer?" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    assert main(["train", "--recipe", str(tmp_path / "nope.toml"), "--out", str(tmp_path / "x")]) == 2
    assert "Recipe file not found" in capsys.readouterr().err


@pytest.mark.slow
def test_module_entry_point():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "probe", "--help"], check=False, capture_output=True, text=True)
    assert proc.returncode == 0 and "evaluate" in proc.stdout


def test_inspect_and_capture_cli(tmp_path, capsys):
    import json

    import numpy as np
    from conftest import GargTransformerModel, write_garg_run

    run = write_garg_run(tmp_path / "garg", GargTransformerModel(3, 8, 16, 2, 2), 3, 8, 16, 2, 2)
    assert main(["inspect", str(run), "--json", "--prompts", "16"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["format"] == "garg" and info["n_layer"] == 2 and info["n_positions"] == 8
    np.savez(tmp_path / "p.npz", xs=np.random.randn(5, 8, 3).astype(np.float32),
             ys=np.random.randn(5, 8).astype(np.float32), other=np.zeros(2))
    assert main(["-q", "capture", str(run), "--prompts", str(tmp_path / "p.npz"), "--out", str(tmp_path / "a.npz"),
                 "--hooks", "ln_final.hook_normalized"]) == 0
    out = np.load(tmp_path / "a.npz")
    assert out["pred"].shape == (5, 8) and out["resid"].shape == (3, 5, 16, 16)
    assert out["ln_final.hook_normalized"].shape == (5, 16, 16)
    np.savez(tmp_path / "bad.npz", xs=np.random.randn(5, 8, 4).astype(np.float32), ys=np.zeros((5, 8), np.float32))
    assert main(["capture", str(run), "--prompts", str(tmp_path / "bad.npz"), "--out", str(tmp_path / "b.npz")]) == 2
    assert "d=4 but the model takes d=3" in capsys.readouterr().err
    assert not (tmp_path / "b.npz").exists()
    np.savez(tmp_path / "noys.npz", xs=np.zeros((5, 8, 3), np.float32))
    assert main(["capture", str(run), "--prompts", str(tmp_path / "noys.npz"), "--out", str(tmp_path / "b.npz")]) == 2
    assert "missing arrays ['ys']" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["gpt2-default", "lstm-default", "gpt2-illcond"])
def test_inspect_and_capture_on_shipped_checkpoints(name, tmp_path, capsys):
    import json

    import numpy as np

    ckpt = REPO / "checkpoints" / name
    assert main(["inspect", str(ckpt), "--json", "--prompts", "64"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["train_step"] == 12000 and info["n_layer"] in (4, 8)
    np.savez(tmp_path / "p.npz", xs=np.random.randn(3, 16, 4).astype(np.float32), ys=np.random.randn(3, 16).astype(np.float32))
    assert main(["-q", "capture", str(ckpt), "--prompts", str(tmp_path / "p.npz"), "--out", str(tmp_path / "a.npz")]) == 0
    assert np.load(tmp_path / "a.npz")["resid"].shape == (info["n_layer"] + 1, 3, 32, info["n_embd"])


LAYER_ARGS = ["--train-prompts", "48", "--val-prompts", "16", "--test-prompts", "32", "--bootstrap", "30"]


@pytest.mark.slow
def test_layer_commands_on_garg_directory_and_lstm(tmp_path, capsys):

    from conftest import GargTransformerModel, build_cfg, write_garg_run

    from probe.io.checkpoint import save_model
    from probe.models import build_model

    garg = write_garg_run(tmp_path / "garg", GargTransformerModel(3, 8, 16, 2, 2), 3, 8, 16, 2, 2)
    cfg = build_cfg(family="lstm")
    save_model(build_model(cfg.model), cfg, tmp_path / "lstm")
    for ckpt in (garg, tmp_path / "lstm"):
        out = tmp_path / f"out-{ckpt.name}"
        assert main(["-q", "readout", str(ckpt), "--out", str(out / "r"), *LAYER_ARGS]) == 0
        assert main(["-q", "heatmap", str(ckpt), "--out", str(out / "h"), "--induced-prompts", "8", "--learners", "newton",
                     "gd_log", *LAYER_ARGS]) == 0
        assert main(["-q", "span", str(ckpt), "--out", str(out / "s"), "--induced-prompts", "8", *LAYER_ARGS]) == 0
        best = pd.read_csv(out / "h" / "best_match.csv")
        assert set(best.sweep) == {"newton", "gd_log"} and set(best.learner) == {"newton", "gd"} and set(best.metric) == {"sime", "simw"}
        assert (out / "h" / "heatmap_newton.png").exists() and (out / "s" / "span.csv").exists()
        assert len(json.loads((out / "r" / "readout_summary.json").read_text())["readout"]["layer"]) == 3
        assert main(["-q", "probes", str(ckpt), "--out", str(out / "p"), "--max-iter", "5", "--prompts", "32",
                     "--test-prompts", "16", "--kinds", "linear"]) == 0
        probes = pd.read_csv(out / "p" / "probes.csv")
        assert set(probes.control) == {"none", "random_model", "shuffled"} and set(probes.layer) == {0, 1, 2}
    assert main(["heatmap", str(garg), "--out", str(tmp_path / "x"), "--learners", "newtn"]) == 2
    assert "Did you mean: newton?" in capsys.readouterr().err


def test_export_to_garg_cli_round_trip(tmp_path, capsys):
    import torch
    from conftest import build_cfg

    from probe import load_checkpoint
    from probe.io.checkpoint import save_model
    from probe.models import build_model

    cfg = build_cfg()
    torch.manual_seed(0)
    save_model(build_model(cfg.model).eval(), cfg, tmp_path / "run")
    assert main(["-q", "export", str(tmp_path / "run"), "--out", str(tmp_path / "garg")]) == 0
    ours, theirs = load_checkpoint(tmp_path / "run"), load_checkpoint(tmp_path / "garg")
    assert theirs.format == "garg" and theirs.config.model == ours.config.model
    import yaml

    assert yaml.safe_load((tmp_path / "garg" / "config.yaml").read_text())["out_dir"] == "garg"  # not the staging name
    xs, ys = torch.randn(2, 8, 3), torch.randn(2, 8)
    torch.testing.assert_close(theirs.model(xs, ys), ours.model(xs, ys), rtol=0, atol=0)
    assert main(["export", str(tmp_path / "run"), "--to", "onnx", "--out", str(tmp_path / "x")]) == 2
    assert "Unknown export layout 'onnx'" in capsys.readouterr().err and not (tmp_path / "x").exists()
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "run")]) == 2  # never over its input
    assert "error:" in capsys.readouterr().err


def test_quiet_flag_before_or_after_the_command(ckpt, capsys):
    import logging

    for argv in (["-q", "inspect", str(ckpt)], ["inspect", str(ckpt), "-q"], ["inspect", "-q", str(ckpt)]):
        logging.root.handlers.clear()
        assert main(argv) == 0
        assert logging.root.level == logging.WARNING
    logging.root.handlers.clear()
    assert main(["inspect", str(ckpt)]) == 0
    assert logging.root.level == logging.INFO


def test_resolution_command_writes_its_table_and_figure_and_refuses_bad_values(tmp_path, capsys):
    out = tmp_path / "res"
    assert main(["-q", "resolution", "--out", str(out), "--dims", "3", "--kappas", "1", "--noise", "0", "0.5",
                 "--prompts", "32"]) == 0
    table = pd.read_csv(out / "resolution.csv")
    assert set(table.metric) == {"sime", "simw", "sime_t_ge_d"} and (out / "resolution.png").exists()
    assert set(table[table.noise == 0].metric) == {"sime", "simw"}  # t >= d needs label noise
    assert "newton" in capsys.readouterr().out
    assert main(["resolution", "--out", str(tmp_path / "bad"), "--kappas", "0.5"]) == 2
    assert "kappa = 0.5, noise = 0.0: task.kappa must be >= 1" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
    # a spread float32 prompts cannot hold (sqrt(1e300) overflowed inside torch, with a traceback)
    assert main(["resolution", "--out", str(tmp_path / "bad"), "--kappas", "1e300"]) == 2
    assert "task.kappa must be <= 1e+12, got 1e+300" in capsys.readouterr().err and not (tmp_path / "bad").exists()


def test_cli_logging_follows_the_current_stderr_across_calls():
    """A second CLI call in one process (sys.stderr replaced and the first one closed, as under
    pytest's capture) logs to the new stderr, with one handler, not a 'Logging error' on the old."""
    import io
    import logging

    from probe.cli import _log_to_stderr

    old = sys.stderr
    try:
        sys.stderr = first = io.StringIO()
        _log_to_stderr(logging.WARNING)
        sys.stderr = second = io.StringIO()
        first.close()
        _log_to_stderr(logging.WARNING)
        logging.getLogger("probe.example").warning("after the swap")
        assert "WARNING probe.example: after the swap" in second.getvalue()
        assert sum(type(h).__name__ == "_CurrentStderr" for h in logging.getLogger().handlers) == 1
    finally:
        sys.stderr = old


@pytest.mark.slow  # a whole export, end to end
def test_export_says_why_its_learning_rate_is_not_the_recipes(tmp_path, capsys):
    """Garg et al.'s config.yaml gets the rate our schedule had reached at the run's last step, so
    their train.py continues where ours stopped; the command and the config's notes say so."""
    import yaml
    from conftest import REPO

    from probe.io.formats import load_checkpoint
    from probe.training.train import learning_rate

    src = REPO / "checkpoints" / "gpt2-default"
    assert main(["export", str(src), "--out", str(tmp_path / "garg")]) == 0
    config = yaml.safe_load((tmp_path / "garg" / "config.yaml").read_text())
    ours = load_checkpoint(src)
    step = int(ours.meta["train_step"])
    lr = config["training"]["learning_rate"]
    assert lr == pytest.approx(learning_rate(ours.config, step - 1)) and lr < ours.config.train.lr
    out = capsys.readouterr().out
    assert f"training.learning_rate is {lr:.3g}: the rate this run's schedule had reached at step {step}" in out
    assert f"(its peak: {ours.config.train.lr:g})" in out
    assert f"at step {step}; training.learning_rate is the rate its schedule had reached there" in config["wandb"]["notes"]


def test_the_parser_of_one_command_has_that_commands_flags_as_the_whole_parser_does():
    """`icl-probe` builds only the named command's flags (`build_parser(argv, every=False)`); each
    command's flags, defaults and help are those of the parser of every command, and the others are
    still listed (so a typo gets the close-match error and `--help` lists them all)."""
    from probe.cli import build_parser, chosen_command

    def described(parser, name):
        sub = parser._subparsers._group_actions[0].choices[name]
        return [(a.dest, tuple(a.option_strings), a.default, a.help, a.nargs) for a in sub._actions]

    whole = build_parser()
    names = list(whole._subparsers._group_actions[0].choices)
    assert chosen_command(["-q", "--max-work", "1e9", "report", "ck"]) == "report"
    assert chosen_command(["--help"]) is None
    for name in names:
        one = build_parser(["-q", name, "--help"], every=False)
        assert list(one._subparsers._group_actions[0].choices) == names
        assert described(one, name) == described(whole, name), name
