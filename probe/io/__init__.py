"""Checkpoints in and outputs out: icl-probe's checkpoint format (checkpoint), the readers of other
formats (formats), planted models' files (planted_io) and run directories (outputs)."""
