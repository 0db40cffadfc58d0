"""The progress bar every long loop shows: tqdm.auto's (a widget in Jupyter) where ipywidgets is
installed, else tqdm's plain text bar. tqdm.auto without ipywidgets warns (TqdmWarning, "IProgress
not found") in every notebook cell that runs a loop, naming a path on the machine."""

from __future__ import annotations

import importlib.util


def _choose():
    if importlib.util.find_spec("ipywidgets") is not None:
        from tqdm.auto import tqdm
    else:
        from tqdm.std import tqdm
    return tqdm


tqdm = _choose()
