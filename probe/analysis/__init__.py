"""The analyses: read-outs, SimE / SimW matching, probes, verdicts, order and forgetting."""
