"""The in-context tasks (config: the [task] section; tasks: their prompt samplers, registered in
config.TASKS) and where each token sits in a prompt (positions)."""

from . import tasks  # noqa: F401  (registers the samplers TaskConfig.name is checked against)
