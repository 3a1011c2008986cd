"""What a run is: its id, configuration, environment, data, versions and code.

Standard library only. "Training got slower" is answered by comparing a run
with an earlier one that should have been as fast, and only what was written
down can be compared: every configuration key, the environment variables
that steer NCCL, PyTorch, CUDA and OpenMP, where the data came from, the
framework versions and the code's commit. ``RunDescriber`` keeps that for one
``Reporter`` and turns it into the protocol's run description line
(``"type": "run"``, docs/protocol.md, "Run description"), which the sender
thread delivers at start, on change, every minute and at the end.

- **Run id** (``launcher_run_id``): the ``run`` argument, else
  ``TRAINMON_RUN_ID``, else torchrun's ``TORCHELASTIC_RUN_ID`` (unless it is
  torchrun's default ``none``), else Slurm's ``SLURM_JOB_ID`` (with
  ``.<SLURM_RESTART_COUNT>`` after a requeue): ids every rank finds for
  itself. Without one, ``process_run_id`` makes a per-process id from the
  start time and 8 random hex digits, and a process that may belong to a
  distributed job takes rank 0's instead once ``torch.distributed`` is
  initialised (``trainmon.client.agreement``); ``RunDescriber.settle`` puts
  the agreed id, rank and world size into the description before it is
  first sent.
- **Secrets**: a config key or environment name that ``is_secret_name`` flags
  is sent as ``REDACTED``, and URL credentials (``s3://AKIA…:…@bucket``) are
  cut out of values, before anything is hashed, sent or logged; the daemon
  applies the same rule again. Data paths lose their credentials before
  ``abspath`` (which would fold ``s3://`` into ``s3:/`` and hide them from the
  URL rule), config and framework keys before they are mapped onto the label
  charset, and every string value of the line (versions, identity, host, data
  paths…) goes through the same rule once more when the description is built.
- **Config**: nested mappings are flattened to dotted keys; values become JSON
  scalars (anything else its ``str()``); ``config_hash`` covers every key at
  full length, while the line carries at most 64 keys of at most 256
  characters and stays within the 16 KiB line limit.
- **Versions**: Python, trainmon, and torch / CUDA / NCCL only when the
  program already imported torch (never imported here). NCCL's is
  ``torch.cuda.nccl.version()``, read only on builds that have NCCL
  (``torch._C._nccl_version``): it returns the compiled-in ``ncclGetVersion``
  and creates no CUDA context.
- **Git**: the commit of the repository holding the working directory, read
  from ``.git`` files (``HEAD``, loose refs, ``packed-refs``; worktrees and
  submodules through ``gitdir:`` and ``commondir``), bounded in depth and
  file size, no subprocess. Whether the tree is dirty would need the index
  and every file's status, so it is sent as unknown (null).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import platform
import re
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import trainmon
from trainmon.training.protocol import (
    GIT_COMMIT_PATTERN,
    MAX_DATA_PATHS,
    MAX_DESCRIPTION_KEY_LENGTH,
    MAX_DESCRIPTION_KEYS,
    MAX_DESCRIPTION_VALUE_LENGTH,
    MAX_LINE_BYTES,
    MAX_VERSION_LENGTH,
    MAX_VERSIONS,
    RUN_DESCRIPTION_INTERVAL_SECONDS,
    ConfigValue,
    config_hash,
    encode_report,
    redact_text,
    redact_value,
    sanitize_label,
    sanitize_run_id,
)
from trainmon.training.report_fields import (
    DEFAULT_MAX_LABEL_LENGTH,
    MAX_COUNT,
    MAX_PATH_BYTES,
    PROTOCOL_VERSION,
)

log = logging.getLogger(__name__)

#: Environment variables recorded with a run: the ones that change how NCCL,
#: PyTorch, CUDA and OpenMP behave.
ENVIRONMENT_PREFIXES: tuple[str, ...] = ("NCCL_", "TORCH_", "PYTORCH_", "CUDA_", "OMP_")
#: Folders walked up from the working directory looking for ``.git``.
MAX_GIT_DEPTH = 64
#: Largest ``HEAD``, loose ref, ``gitdir:`` or ``commondir`` file read.
MAX_GIT_FILE_BYTES = 4096
#: Largest ``packed-refs`` read (a repository with ~100 000 tags).
MAX_PACKED_REFS_BYTES = 16 * 1024 * 1024
#: Symbolic refs followed from ``HEAD``.
MAX_REF_HOPS = 5
#: Nesting depth of the config flattened into dotted keys (deeper: ``str()``).
MAX_CONFIG_DEPTH = 8
#: Longest string a config value is hashed with (``str()`` of a large object).
MAX_HASHED_VALUE_LENGTH = 4096
#: Modules whose ``__version__`` is recorded when the program imported them.
FRAMEWORK_MODULES: tuple[tuple[str, str], ...] = (
    ("lightning", "lightning"), ("pytorch_lightning", "pytorch_lightning"),
    ("transformers", "transformers"), ("accelerate", "accelerate"),
    ("deepspeed", "deepspeed"), ("numpy", "numpy"),
)

#: One path or several (``Reporter(data_paths=...)``, ``describe(data_paths=...)``).
DataPaths = Iterable[str | os.PathLike[str]] | str | os.PathLike[str]

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_HOST_FORBIDDEN = re.compile(r"[^A-Za-z0-9_.-]")
_REF_NAME = re.compile(r"refs/[A-Za-z0-9_./@+-]{1,240}")


def resolve_run_id(run: str | None, environ: Mapping[str, str], started: float) -> str:
    """The run id: ``run``, the launcher's job id, or a fresh per-process id."""
    return launcher_run_id(run, environ) or process_run_id(started)


def launcher_run_id(run: str | None, environ: Mapping[str, str]) -> str | None:
    """``run``, ``TRAINMON_RUN_ID``, torchrun's or Slurm's job id (cleaned), else None:
    an id every rank of the job finds for itself. A restart of the job's processes by
    its launcher is a run of its own (its restart count appended, ``<id>.<n>``), as it
    redoes the work since its checkpoint: torchrun's ``--max-restarts`` keeps
    ``TORCHELASTIC_RUN_ID`` and counts ``TORCHELASTIC_RESTART_COUNT``, Slurm's
    requeue keeps ``SLURM_JOB_ID`` and counts ``SLURM_RESTART_COUNT``."""
    slurm = _restarted(environ.get("SLURM_JOB_ID", "").strip(),
                       environ.get("SLURM_RESTART_COUNT", ""))
    elastic = environ.get("TORCHELASTIC_RUN_ID", "").strip()
    if elastic != "none":
        elastic = _restarted(elastic, environ.get("TORCHELASTIC_RESTART_COUNT", ""))
    for candidate in (run, environ.get("TRAINMON_RUN_ID"),
                      None if elastic == "none" else elastic, slurm):
        if candidate is not None and str(candidate).strip():
            raw = str(candidate).strip()
            cleaned = sanitize_run_id(raw)
            if cleaned != raw:
                log.warning("trainmon run id %.80r is sent as %r (allowed: A-Za-z0-9_.:-, "
                            "at most 64)", raw, cleaned)
            return cleaned
    return None


def _restarted(run: str, restarts: str) -> str:
    """``run`` of the launcher's ``restarts``-th restart (``run`` itself for the first)."""
    restarts = restarts.strip()
    if run and restarts.isdigit() and int(restarts) > 0:
        return f"{run}.{int(restarts)}"
    return run


def process_run_id(started: float) -> str:
    """A fresh id for a run of one process: ``<UTC start %Y%m%dT%H%M%SZ>-<8 hex digits>``."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(started))
    return f"{stamp}-{secrets.token_hex(4)}"


def flatten_settings(settings: object) -> dict[str, ConfigValue]:
    """``settings`` flattened to dotted keys with JSON-scalar values, secrets redacted.

    A mapping (OmegaConf's ``DictConfig`` is one), a dataclass or an object
    with attributes (``argparse.Namespace``). Full length (what
    ``config_hash`` covers); ``limit_settings`` makes it fit the line. Keys
    are mapped onto the label charset (``"lr schedule"`` → ``"lr_schedule"``);
    when two keys meet, the first one stays. Never raises: a config that
    cannot be read becomes one ``config`` key naming its type.
    """
    flat: dict[str, ConfigValue] = {}
    try:
        mapping = _as_mapping(settings)
        if mapping:
            _flatten(mapping, "", 0, flat)
    except Exception as error:  # a user object's items()/__getattr__ may raise anything
        log.warning("trainmon: cannot read the run config (%s); only its type is recorded",
                    type(error).__name__)
        flat = {"config": f"<unreadable {type(settings).__name__}>"}
    return {key: redact_value(key, value) for key, value in flat.items()}


def _as_mapping(settings: object) -> Mapping[Any, Any]:
    if settings is None:
        return {}
    if isinstance(settings, Mapping):
        return settings
    if dataclasses.is_dataclass(settings) and not isinstance(settings, type):
        return {item.name: getattr(settings, item.name) for item in dataclasses.fields(settings)}
    if hasattr(settings, "__dict__"):
        return {key: value for key, value in vars(settings).items() if not key.startswith("_")}
    return {"config": settings}


def _flatten(settings: Mapping[Any, Any], prefix: str, depth: int,
             flat: dict[str, ConfigValue]) -> None:
    for raw_key, value in settings.items():
        key = sanitize_label(redact_text(f"{prefix}{raw_key}"), 4 * MAX_DESCRIPTION_KEY_LENGTH)
        if isinstance(value, Mapping) and value and depth < MAX_CONFIG_DEPTH:
            _flatten(value, f"{key}.", depth + 1, flat)
        else:
            flat.setdefault(key[:MAX_DESCRIPTION_KEY_LENGTH], _scalar(value))


def _scalar(value: object) -> ConfigValue:
    """A JSON scalar for ``value``: numpy/torch scalars unwrapped, others their text."""
    if value is None or isinstance(value, (bool, str)):
        return _clean(value, MAX_HASHED_VALUE_LENGTH) if isinstance(value, str) else value
    if isinstance(value, int):
        return value if abs(value) <= MAX_COUNT else str(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    item = getattr(value, "item", None)  # numpy and torch scalars
    if callable(item) and getattr(value, "ndim", 1) == 0:
        try:
            unwrapped = item()
        except Exception:  # whatever a foreign scalar raises
            unwrapped = None
        if isinstance(unwrapped, (bool, int, float, str)):
            return _scalar(unwrapped)
    try:
        if isinstance(value, (list, tuple)):
            text = json.dumps(value, separators=(",", ":"), default=str)
        else:
            text = str(value)
    except Exception:  # a user object's __str__ may raise anything
        text = f"<{type(value).__name__}>"
    return _clean(text, MAX_HASHED_VALUE_LENGTH)


def limit_settings(settings: Mapping[str, ConfigValue]) -> dict[str, ConfigValue]:
    """At most ``MAX_DESCRIPTION_KEYS`` keys (sorted), strings cut to 256 characters."""
    limited: dict[str, ConfigValue] = {}
    for key in sorted(settings)[:MAX_DESCRIPTION_KEYS]:
        value = settings[key]
        limited[key] = _clean(value, MAX_DESCRIPTION_VALUE_LENGTH) if isinstance(value, str) \
            else value
    return limited


def capture_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The NCCL_*, TORCH_*, PYTORCH_*, CUDA_*, OMP_* variables (64 at most), secrets redacted."""
    for _ in range(3):  # another thread may set a variable while this one copies
        try:
            copied = dict(environ)
            break
        except RuntimeError:
            continue
    else:
        return {}
    names = sorted(
        name for name in copied
        if name.startswith(ENVIRONMENT_PREFIXES) and name.isascii()
        and len(name) <= MAX_DESCRIPTION_KEY_LENGTH and name.replace("_", "a").isalnum()
    )[:MAX_DESCRIPTION_KEYS]
    return {
        # redacted whole, then cut: a cut first could leave part of a secret unrecognised
        name: _clean(str(redact_value(name, copied[name])), MAX_DESCRIPTION_VALUE_LENGTH)
        for name in names
    }


def capture_versions() -> dict[str, str]:
    """Python, trainmon, and the versions of torch, CUDA, NCCL and the frameworks
    the program already imported (nothing is imported here)."""
    versions = {"python": platform.python_version(), "trainmon": trainmon.__version__}
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            versions["torch"] = str(torch.__version__)
            cuda = getattr(getattr(torch, "version", None), "cuda", None)
            if cuda:
                versions["cuda"] = str(cuda)
            if callable(getattr(getattr(torch, "_C", None), "_nccl_version", None)):
                versions["nccl"] = ".".join(str(part) for part in torch.cuda.nccl.version())
        except Exception as error:  # a broken torch must not stop training
            log.debug("trainmon: cannot read the torch versions: %s", error)
    for module_name, name in FRAMEWORK_MODULES:
        module = sys.modules.get(module_name)
        version = getattr(module, "__version__", None)
        if isinstance(version, str):
            versions[name] = version
    kept = list(versions.items())[:MAX_VERSIONS]
    return {name: _clean(value, MAX_VERSION_LENGTH) for name, value in kept}


def absolute_data_paths(paths: DataPaths) -> tuple[str, ...]:
    """``paths`` (or one path) without URL credentials, made absolute (symlinks
    kept), deduplicated; those the protocol cannot carry (control characters,
    over 4096 bytes) and those past 8 are left out with a warning (which names
    the path without its credentials)."""
    if isinstance(paths, (str, bytes, os.PathLike)):
        paths = [paths]
    try:
        candidates = list(paths)
    except TypeError:
        log.warning("trainmon: data_paths must be paths, not %s", type(paths).__name__)
        return ()
    kept: list[str] = []
    for path in candidates:
        try:
            # before abspath, which folds "s3://" into "s3:/"
            text = redact_text(os.fsdecode(os.fspath(path)))
        except (TypeError, ValueError, UnicodeError) as error:
            log.warning("trainmon: data path of type %s not recorded: %s",
                        type(path).__name__, type(error).__name__)
            continue
        try:
            absolute = os.path.abspath(text)
            size = len(absolute.encode("utf-8"))
        except (TypeError, ValueError, UnicodeError) as error:
            log.warning("trainmon: data path %.200r not recorded: %s", text, error)
            continue
        if size > MAX_PATH_BYTES or _CONTROL.search(absolute):
            log.warning("trainmon: data path %.200r not recorded: over %d bytes or "
                        "control characters", text, MAX_PATH_BYTES)
        elif absolute not in kept:
            kept.append(absolute)
    if len(kept) > MAX_DATA_PATHS:
        log.warning("trainmon: %d data paths, only the first %d are recorded",
                    len(kept), MAX_DATA_PATHS)
    return tuple(kept[:MAX_DATA_PATHS])


def _redacted_strings(value: object) -> object:
    """``value`` with ``redact_text`` applied to every string value in it (keys are
    labels, already redacted when flattened: ``redact_text`` would bring ``<`` back)."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {key: _redacted_strings(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_redacted_strings(item) for item in value]
    return value


def hostname() -> str:
    """This machine's hostname, in the protocol's charset ("" when there is none)."""
    return _HOST_FORBIDDEN.sub("_", socket.gethostname())[:253]


def git_commit(start: str) -> str | None:
    """The commit checked out in the repository holding ``start``, else None."""
    folder = os.path.abspath(start)
    for _ in range(MAX_GIT_DEPTH):
        git_dir = _git_dir(folder)
        if git_dir is not None:
            return _head_commit(git_dir)
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent
    return None


def _git_dir(folder: str) -> str | None:
    """``folder/.git`` as a git directory: the folder itself, or where a
    ``gitdir:`` file (worktree, submodule) points."""
    candidate = os.path.join(folder, ".git")
    if os.path.isdir(candidate):
        return candidate
    text = _read_small(candidate, MAX_GIT_FILE_BYTES)
    if text is None or not text.startswith("gitdir:"):
        return None
    target = os.path.join(folder, text[len("gitdir:"):].strip())
    return target if os.path.isdir(target) else None


def _head_commit(git_dir: str) -> str | None:
    common = git_dir
    pointer = _read_small(os.path.join(git_dir, "commondir"), MAX_GIT_FILE_BYTES)
    if pointer:
        common = os.path.join(git_dir, pointer.strip())
    content = _read_small(os.path.join(git_dir, "HEAD"), MAX_GIT_FILE_BYTES)
    for _ in range(MAX_REF_HOPS):
        if content is None:
            return None
        content = content.strip()
        if GIT_COMMIT_PATTERN.fullmatch(content):
            return content
        if not content.startswith("ref:"):
            return None
        ref = content[len("ref:"):].strip()
        if not _REF_NAME.fullmatch(ref) or ".." in ref:
            return None
        content = _read_small(os.path.join(git_dir, ref), MAX_GIT_FILE_BYTES)
        if content is None and common != git_dir:
            content = _read_small(os.path.join(common, ref), MAX_GIT_FILE_BYTES)
        if content is None:
            return _packed_ref(common, ref)
    return None


def _packed_ref(common: str, ref: str) -> str | None:
    """The commit of ``ref`` in ``packed-refs`` (read up to MAX_PACKED_REFS_BYTES)."""
    try:
        with open(os.path.join(common, "packed-refs"), encoding="utf-8",
                  errors="replace") as lines:
            read = 0
            for line in lines:
                read += len(line)
                if read > MAX_PACKED_REFS_BYTES:
                    return None
                commit, _, name = line.rstrip("\n").partition(" ")
                if name == ref and GIT_COMMIT_PATTERN.fullmatch(commit):
                    return commit
    except OSError:
        return None
    return None


def _read_small(path: str, limit: int) -> str | None:
    """The text of ``path`` if it is a file of at most ``limit`` bytes, else None."""
    try:
        with open(path, "rb") as file:
            data = file.read(limit + 1)
    except OSError:
        return None
    if len(data) > limit:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _clean(text: str, limit: int) -> str:
    """``text`` without control characters, cut to ``limit`` characters (``…`` marks a cut)."""
    text = _CONTROL.sub("?", text)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates (os.environ's surrogateescape)
        text = text.encode("utf-8", "replace").decode("utf-8")
    return text if len(text) <= limit else text[: limit - 1] + "…"


class RunDescriber:
    """The run description of one reporter, and when it is due to be sent.

    ``update()`` (``Reporter.describe``) may run on any thread; ``line()`` and
    ``sent()`` run on the sender thread (and in ``close()``). The config, the
    data paths and the framework settings are what callers gave; the
    environment and the versions are read again at every build, so a variable
    set after the reporter started is recorded from the next description on.
    """

    def __init__(
        self,
        *,
        job: str,
        rank: int,
        reporter_id: str,
        world_size: int | None,
        run: str,
        started: float,
        environ: Mapping[str, str],
        config: object = None,
        data_paths: DataPaths | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._identity: dict[str, object] = {
            # a label: credentials out, then the charset (``<redacted>`` → ``_redacted_``)
            "job": sanitize_label(redact_text(job), DEFAULT_MAX_LABEL_LENGTH),
            "rank": rank, "reporter_id": reporter_id, "run": run,
            "started": started, "world_size": world_size,
        }
        self._environ = environ
        self._clock = clock
        self._lock = threading.Lock()
        self._config = flatten_settings(config)
        self._config_hash = config_hash(self._config)
        self._data_paths = absolute_data_paths(data_paths or ())
        self._framework: dict[str, ConfigValue] = {}
        # Read once, on the first build (sender thread), not in the constructor.
        self._static: dict[str, object] | None = None
        self._due = 0.0  # monotonic time of the next send; 0: at the next tick
        self._retry = 1.0
        # Changes made by update(), and how many of them the last line() had:
        # a change made while a line is in flight is sent again after it.
        self._changes = 0
        self._changes_in_line = 0
        self._trimmed_logged = False

    @property
    def config_hash(self) -> str:
        return self._config_hash

    def settle(self, *, run: str, rank: int, world_size: int) -> None:
        """Replace the run id, rank and world size given at construction with the
        agreed ones (``trainmon.client.agreement``); the reporter calls it before it
        sends the first description, so no description carries the provisional ones."""
        with self._lock:
            self._identity.update(run=run, rank=rank, world_size=world_size)

    def update(
        self,
        config: object = None,
        data_paths: DataPaths | None = None,
        framework: object = None,
    ) -> None:
        """Merge keys into the config and framework settings, add data paths;
        the description is sent again at the next tick if that changed it."""
        config_keys = flatten_settings(config) if config else {}
        framework_keys = flatten_settings(framework) if framework else {}
        paths = absolute_data_paths(data_paths) if data_paths else ()
        with self._lock:
            before = (self._config, self._framework, self._data_paths)
            if config_keys:
                self._config = {**self._config, **config_keys}
                self._config_hash = config_hash(self._config)
            if framework_keys:
                self._framework = {**self._framework, **framework_keys}
            if paths:
                self._data_paths = absolute_data_paths((*self._data_paths, *paths))
            if (self._config, self._framework, self._data_paths) != before:
                self._due = 0.0
                self._changes += 1

    def description(self, ended: str | None = None) -> dict[str, object]:
        """The run description as sent (within the line limit)."""
        with self._lock:
            if self._static is None:
                commit = None
                try:
                    commit = git_commit(os.getcwd())
                except OSError as error:  # the working directory was removed
                    log.debug("trainmon: no git commit: %s", error)
                self._static = {
                    "git": None if commit is None else {"commit": commit, "dirty": None},
                    "host": hostname(),
                }
            description: dict[str, object] = {
                "v": PROTOCOL_VERSION, "type": "run", **self._identity,
                "config_hash": self._config_hash,
                "config": limit_settings(self._config),
                "environment": capture_environment(self._environ),
                "data_paths": list(self._data_paths),
                "versions": capture_versions(),
                "git": self._static["git"],
                "host": self._static["host"],
                "framework": limit_settings(self._framework),
            }
        if ended is not None:
            description["ended"] = ended
        redacted = {key: value if key == "job" else _redacted_strings(value)
                    for key, value in description.items()}
        return self._fit(redacted)

    def due(self) -> bool:
        """Whether the description is to be sent now: first, changed, a minute
        since the last delivery, or a retry after a failed one."""
        return self._clock() >= self._due

    def line(self, ended: str | None = None) -> bytes:
        """The description as one encoded line (``ended``: ``"finished"`` at the end)."""
        with self._lock:
            changes = self._changes
        line = encode_report(self.description(ended))
        with self._lock:
            self._changes_in_line = changes
        return line

    def sent(self, delivered: bool) -> None:
        """Schedule the next send: a minute after a delivery (at the next tick
        when ``update()`` changed the description after ``line()`` built it);
        after a failure, 1 s, 2 s, 4 s… up to a minute."""
        now = self._clock()
        with self._lock:
            if delivered and self._changes != self._changes_in_line:
                self._due = 0.0
                self._retry = 1.0
            elif delivered:
                self._due = now + RUN_DESCRIPTION_INTERVAL_SECONDS
                self._retry = 1.0
            else:
                self._due = now + self._retry
                self._retry = min(self._retry * 2, RUN_DESCRIPTION_INTERVAL_SECONDS)

    def _fit(self, description: dict[str, object]) -> dict[str, object]:
        """Leave keys out until the line fits ``MAX_LINE_BYTES``: always the last
        key of the largest of ``config``, ``framework`` and ``environment``, so
        one huge section does not empty the others; ``config_hash`` still covers all."""
        size = len(encode_report(description)) - 1
        if size <= MAX_LINE_BYTES:
            return description
        sections: dict[str, dict[str, object]] = {}
        weights: dict[str, int] = {}
        for field in ("config", "framework", "environment"):
            settings = description[field]
            assert isinstance(settings, dict)
            sections[field] = settings
            weights[field] = len(encode_report(settings))
        dropped = 0
        while size > MAX_LINE_BYTES and any(sections.values()):
            field = max(weights, key=lambda name: weights[name] if sections[name] else -1)
            settings = sections[field]
            key = next(reversed(settings))
            entry = {key: settings.pop(key)}
            cost = len(json.dumps(entry, separators=(",", ":"))) - 1  # "key":value,
            size -= cost
            weights[field] -= cost
            dropped += 1
        if len(encode_report(description)) - 1 > MAX_LINE_BYTES:  # estimates were short
            for field in ("config", "framework", "environment"):
                description[field] = {}
            description["data_paths"] = []
        if not self._trimmed_logged:
            self._trimmed_logged = True
            log.warning("trainmon: the run description is over %d bytes; %d config, "
                        "framework or environment keys are left out of it (the config "
                        "hash still covers them)", MAX_LINE_BYTES, dropped)
        return description

