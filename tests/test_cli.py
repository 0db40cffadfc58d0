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
    assert "n_examples" in out and "least_squares" in out
    frame = pd.read_csv(tmp_path / "eval" / "eval.csv")
    assert len(frame) == 8 and (tmp_path / "eval" / "eval.png").stat().st_size > 1000


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


def test_module_entry_point():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "probe", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "evaluate" in proc.stdout
