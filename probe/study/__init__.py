"""Studies over families of checkpoints: recipe -> per-model analyses (executors) -> tidy table -> figures."""
