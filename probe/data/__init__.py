"""The in-context tasks and their prompts (tasks) and where each token sits in a prompt (positions)."""
