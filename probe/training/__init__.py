"""Training in-context learners on the tasks (train): the checkpoints the analyses read."""
