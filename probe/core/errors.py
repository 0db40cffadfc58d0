"""User-facing errors: the CLI prints their message and exits non-zero, without a traceback."""


class ProbeError(Exception):
    """An error caused by the user's input (a path, a config value, a checkpoint)."""


class ConfigError(ProbeError, ValueError):
    """A configuration value is missing, unknown or out of range."""


class NotMeasurable(ConfigError):
    """The data at hand cannot support a measurement (too few eigen-directions, prefixes, prompts):
    the stage's own command refuses with this message; a report writes the stage's section as "not
    measured here" and completes. `knob` names the setting that would change it."""

    def __init__(self, message: str, knob: str = "") -> None:
        super().__init__(message)
        self.knob = knob


class CheckpointError(ProbeError):
    """A checkpoint could not be found, read, or matched to its config."""


class TrainingDiverged(ProbeError):
    """The training loss became NaN or infinite."""


class OutputError(ProbeError):
    """An output path that must not be written (it would lose or overwrite the user's files)."""


class RenamedSetting(FutureWarning):
    """A settings key or flag was given under its old name; it still works, under its new one."""
