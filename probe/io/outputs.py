"""Where commands may write, and how: one output policy for every command.

`--out` may be a new path, an empty directory, or a directory icl-probe itself wrote for the
same command (it holds a marker file, `.icl-probe-output.json`, listing the command and the
files written). Everything else is refused before any work: the current directory or one of
its parents, the input checkpoint or a directory holding it, a directory with files icl-probe
did not write, a file where a directory is expected, a symbolic link, an unwritable parent.
`--force` allows writing into a directory that holds other files (they are kept) or one that
another command wrote; it never allows the input itself, a parent of the input, a symlink, or
the deletion or replacement of a file icl-probe did not write: each command declares the names
it writes (`WRITES`), and a file of someone else's under one of them is refused before any work.

Directory outputs are built in a private staging directory beside `out` and published only
when the command succeeded, by one atomic exchange of the two directories (Linux renameat2), so
at every instant `out` holds the complete earlier output or the complete new one.
"""

from __future__ import annotations

import ctypes
import fnmatch
import json
import os
import re
import shutil
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ..core.errors import OutputError

MARKER = ".icl-probe-output.json"
STAGING_TAG = ".icl-tmp-"
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_name(text: str) -> str:
    """A file-name component derived from user input that cannot leave its directory."""
    name = _SAFE.sub("_", str(text)).strip("._") or "unnamed"
    return name[:120]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def fix_mode(path: Path) -> None:
    """Give files made through mkstemp/mkdtemp (0600/0700) the usual umask-derived mode."""
    base = 0o777 if path.is_dir() else 0o666
    try:
        os.chmod(path, base & ~_umask())
    except OSError:
        pass


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def staging_dir(parent: Path, name: str) -> Path:
    """A private staging directory `.<name>.icl-tmp-<pid>-XXXX` in `parent` (stale ones are removed)."""
    clean_stale(parent)
    path = Path(tempfile.mkdtemp(prefix=f".{name}{STAGING_TAG}{os.getpid()}-", dir=parent))
    fix_mode(path)
    return path


STAGING_NAME = re.compile(r"\..*" + re.escape(STAGING_TAG) + r"(\d+)-")


def clean_stale(parent: Path, pattern: re.Pattern = STAGING_NAME) -> None:
    """Remove entries named by `pattern` (its group 1 is the owner's pid: icl-probe's own staging
    or spill directories) whose process is no longer running."""
    if not parent.is_dir():
        return
    for entry in parent.iterdir():
        match = pattern.match(entry.name)
        if match and not _pid_alive(int(match.group(1))):
            shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)


# What each command writes into --out: glob patterns over paths relative to it ("*" crosses "/"); the
# commands derived from stages add theirs when they run (probe/cli/stage.py `writes`).
WRITES: dict[str, tuple[str, ...]] = {
    "report": ("index.html", "summary.json", "recipe.json", "figures/*", "data/*"),
    "resolution": ("resolution.csv", "resolution.png", "run.json"),
    "planted": ("config.json", "model.safetensors"),
    "export": ("config.yaml", "state.pt"),
    "train": (
        "config.json",
        "model.safetensors",
        "train_state.pt",
        "train_log.csv",
        "eval_log.csv",
        "snapshots/step_*/config.json",
        "snapshots/step_*/model.safetensors",
    ),
    "study": (
        "study.csv",
        "summary.json",
        "index.html",
        "figures/*",
        "models/*/rows.csv",
        "models/*/done.json",
        ".cache/*",
        "submitit/*",
    ),
}


def writes(command: str, relative: str) -> bool:
    """Whether `command` may write the file at `relative` (a path inside its --out)."""
    return any(fnmatch.fnmatch(relative, pattern) for pattern in WRITES.get(command, ("*",)))


def exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one atomic step (Linux renameat2 RENAME_EXCHANGE); False where
    the system cannot, and nothing was changed."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def replace_dir(new: Path, out: Path) -> None:
    """Put directory `new` at `out` (which may exist): atomically where the system allows; the
    earlier `out` is deleted afterwards."""
    if out.exists() and exchange(new, out):
        shutil.rmtree(new, ignore_errors=True)  # `new` now holds the earlier output
        return
    old = None
    if out.exists():
        old = staging_dir(out.resolve().parent, out.name + ".old")
        os.rmdir(old)
        os.replace(out, old)
    os.replace(new, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def written_by(directory: Path) -> str | None:
    """The command whose output `directory` is, by its marker (None: icl-probe did not write it)."""
    marker = _read_marker(directory)
    return None if marker is None else marker.get("command")


def _read_marker(directory: Path) -> dict | None:
    try:
        data = json.loads((directory / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("files"), list):
        return None
    return data


def _is_within(inner: Path, outer: Path) -> bool:
    try:
        inner.relative_to(outer)
        return True
    except ValueError:
        return False


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _listing(directory: Path) -> set[str]:
    return {str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file() or p.is_symlink()} - {MARKER}


@dataclass
class OutputTarget:
    """A checked `--out`: build into `stage()`, then `publish()`; nothing is written before that."""

    path: Path
    command: str
    kind: str = "dir"  # "dir" or "file"
    force: bool = False
    inputs: tuple[Path, ...] = ()
    _previous: dict | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        self.inputs = tuple(Path(p) for p in self.inputs if p is not None)
        self.check()

    def _refuse(self, why: str, fix: str) -> None:
        raise OutputError(f"--out {self.path}: {why}; {fix}")

    def check(self) -> None:
        """Refuse, before any work, an --out the output policy does not allow (module docstring)."""
        out = self.path
        self._check_location()
        if not out.exists():
            return
        if self.kind == "file":
            if not out.is_file():
                self._refuse("exists and is not a regular file", "choose a new file name")
            if not self.force:
                self._refuse("already exists", "choose a new file name or pass --force to replace it")
            return
        if not out.is_dir():
            self._refuse("is an existing file, not a directory", "choose a new directory name")
        if any(out.iterdir()):
            self._check_existing_directory()

    def _check_location(self) -> None:
        """Not a symlink, not an input or inside one, not the working directory (without --force),
        in a writable directory."""
        out = self.path
        if out.is_symlink():
            self._refuse("is a symbolic link", "give the real path it points to, or a new path")
        resolved = out.resolve()
        for given in self.inputs:
            source = given.resolve()
            if resolved == source:
                self._refuse("is the input itself", "choose a new directory, e.g. reports/<name>")
            if _is_within(source, resolved):
                self._refuse(f"contains the input {given}", "choose a new directory outside it")
            if self.kind == "file" and out.exists() and source.is_dir() and _is_within(resolved, source):
                self._refuse(f"is a file of the input {given}", "choose a new file outside it")
        if (resolved == Path.cwd().resolve() or _is_within(Path.cwd().resolve(), resolved)) and not self.force:
            self._refuse(
                "is the current directory or one of its parents",
                "choose a new directory (or pass --force to write beside what is there, deleting nothing)",
            )
        base = _nearest_existing(resolved.parent)
        if not base.is_dir():
            self._refuse(f"its parent {base} is a file", "choose a path inside a directory")
        if not os.access(base, os.W_OK) or (resolved.is_dir() and not os.access(resolved, os.W_OK)):
            self._refuse(
                f"{base if os.access(base, os.W_OK) is False else resolved} is not writable",
                "choose a writable location",
            )

    def _check_existing_directory(self) -> None:
        """A directory with entries: icl-probe's own output of this command, or (with --force) one
        whose files icl-probe did not write are never replaced."""
        out = self.path
        marker = _read_marker(out)
        foreign = _listing(out) - set(marker["files"]) if marker else _listing(out)
        foreign = {f for f in foreign if STAGING_TAG not in f}
        if marker and marker.get("in_place") and marker.get("command") == self.command:
            # a run directory filled in place (an interrupted study): its own names are its own
            foreign = {f for f in foreign if not writes(self.command, f)}
        clash = sorted(f for f in foreign if writes(self.command, f))
        if clash and self.force:
            self._refuse(
                f"holds {', '.join(clash[:3])}, which icl-probe did not write and `icl-probe {self.command}` "
                "would replace",
                "move it away or choose another --out (--force never replaces a file icl-probe did not write)",
            )
        if marker is None and not self.force:
            self._refuse(
                "is a directory icl-probe did not write (it has no " + MARKER + ")",
                "choose a new directory, or pass --force to write beside its files (none is deleted)",
            )
        if marker is not None and foreign and not self.force:
            self._refuse(
                f"holds files icl-probe did not write ({', '.join(sorted(foreign)[:3])})",
                "move them away or pass --force to write beside them (none is deleted)",
            )
        if marker is not None and marker.get("command") != self.command and not self.force:
            self._refuse(
                f"was written by `icl-probe {marker.get('command')}`, not `{self.command}`",
                "choose a new directory, or pass --force to replace that output",
            )
        self._previous = marker

    def check_same_source(self, sources: dict[str, str], label: str) -> None:
        """Refuse, even with --force, to replace an output made from other inputs: `sources` are
        the fingerprints this run records in the marker (probe.io.checkpoint's `fingerprint`), and
        an earlier marker holding different ones names another checkpoint. A marker without them
        (written before they were recorded) is not compared."""
        previous = self._previous or {}
        differs = [k for k, v in sources.items() if k in previous and previous[k] != v]
        if differs:
            self._refuse(
                f"holds a {previous.get('command')} made from another checkpoint "
                f"({previous.get('checkpoint_path', previous.get('checkpoint', '?'))}), not {label}",
                "choose another --out, or delete that directory yourself to replace it (--force does not)",
            )

    # ------------------------------------------------------------------ writing

    def stage(self) -> Path:
        """A private directory (or, for files, a directory holding the file) to build the output in."""
        parent = self.path.resolve().parent
        parent.mkdir(parents=True, exist_ok=True)
        return staging_dir(parent, self.path.name)

    def publish(self, staged: Path, record: dict | None = None) -> Path:
        """Move the staged output into place; remove only files an earlier icl-probe run wrote."""
        try:
            if self.kind == "file":
                built = staged / self.path.name
                fix_mode(built)
                os.replace(built, self.path)
                return self.path
            new_files = sorted(_listing(staged))
            for rel in new_files:
                fix_mode(staged / rel)
            out = self.path
            previous = set(self._previous["files"]) if self._previous else set()
            if not out.exists() or (out.is_dir() and not _listing(out) - previous):
                # only our own files there: swap whole directories, the marker inside the new one
                write_marker(staged, self.command, new_files, record)
                replace_dir(staged, out)
                return out
            else:  # --force beside foreign files: replace ours file by file, keep theirs
                theirs = sorted(rel for rel in new_files if (out / rel).exists() and rel not in previous)
                if theirs:  # check() refuses these before any work; this guard never lets one through
                    raise OutputError(f"--out {out}: {theirs[0]} was not written by icl-probe; nothing was replaced")
                for rel in sorted(previous - set(new_files)):
                    target = out / rel
                    if target.is_file() and _is_within(target.resolve(), out.resolve()):
                        target.unlink()
                for rel in new_files:
                    target = out / rel
                    target.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(staged / rel, target)
            write_marker(out, self.command, new_files, record)
            return out
        finally:
            if staged.exists():
                shutil.rmtree(staged, ignore_errors=True)


def write_marker(directory: Path, command: str, files: list[str], record: dict | None = None) -> None:
    payload = {"command": command, "files": sorted(files), **(record or {})}
    tmp = directory / f".{MARKER}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    os.replace(tmp, directory / MARKER)


def mark_run_directory(directory: Path, command: str) -> None:
    """Mark a directory a command fills in place (train, study). The marker lists only the files
    of the names that command writes (`WRITES`), so a later --force can never delete a file
    someone else put there."""
    directory.mkdir(parents=True, exist_ok=True)
    files = [f for f in _listing(directory) if writes(command, f) and STAGING_TAG not in f]
    write_marker(directory, command, sorted(files), {"in_place": True})


def check_run_output(
    out: Path, command: str, *, resume: bool = False, force: bool = False, inputs: tuple[Path, ...] = ()
) -> OutputTarget | None:
    """The policy for commands that write a run directory in place (train, planted)."""
    out = Path(out)
    if resume:
        if out.is_symlink():
            raise OutputError(f"--out {out}: is a symbolic link; give the real path")
        if not (out / "train_state.pt").is_file():
            raise OutputError(
                f"--resume: {out} holds no train_state.pt to resume from; drop --resume to start a new run"
            )
        if not os.access(out, os.W_OK):
            raise OutputError(f"--out {out}: is not writable; choose a writable location")
        return None
    if (out / "train_state.pt").exists() and not force:
        raise OutputError(
            f"--out {out}: already holds a training run; pass --resume to continue it or choose another --out"
        )
    return OutputTarget(out, command, "dir", force, inputs)


def remove_previous(target: OutputTarget) -> None:
    """Before a run directory is rewritten with --force: delete the files icl-probe wrote there."""
    if target._previous is None:
        return
    root = target.path.resolve()
    for rel in target._previous["files"]:
        path = root / rel
        if path.is_file() and _is_within(path.resolve(), root):
            path.unlink()
    for sub in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        if not any(sub.iterdir()):
            sub.rmdir()


def is_regular_file(path: Path) -> bool:
    """True for a regular file (not a FIFO, socket or device: opening those can hang)."""
    try:
        return stat.S_ISREG(path.stat().st_mode)
    except OSError:
        return False
