"""Process id → who runs it: Kubernetes pod/namespace/container or Slurm job.

Sources, under the injected ``proc`` root (``/host/proc`` in a container; the
daemon needs the host's PID namespace view because NVML reports host PIDs):

- ``<proc>/<pid>/cgroup``: pod UID, container id and Slurm job (see
  ``cgroup``); readable by anyone;
- ``<proc>/<pid>/environ``: ``SLURM_JOB_ID`` when the cgroup path has no
  ``job_<id>`` (Slurm without the cgroup plugin), and the NCCL variables
  checked by ``trainmon.diagnosis.nccl``. Readable only by the process's owner or with
  ``CAP_SYS_PTRACE``: without it those facts stay unknown, the rest works;
- the kubelet's pod list (``KubeletPodDirectory``, optional): pod UID → pod,
  namespace and container names.

Nothing is cached per PID: both files are tiny and PIDs are reused. The files
are read here rather than through psutil: psutil takes its procfs root from a
module global (``psutil.PROCFS_PATH``), not per reader, so it cannot honour the
injected root (a host mount, a test's fixture tree) beside the collectors that
read the real one, and it has no cgroup reader.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from trainmon.attribution.cgroup import parse_cgroup
from trainmon.attribution.kubelet import KubeletPodDirectory
from trainmon.logthrottle import LogThrottle

log = logging.getLogger(__name__)

#: A process environment larger than this is truncated (bytes); real ones are a few KiB.
MAX_ENVIRON_BYTES = 1 << 20


class EnvironUnreadable(Exception):
    """``/proc/<pid>/environ`` exists but may not be read (no ptrace access)."""


@dataclass(frozen=True)
class ProcessAttribution:
    """Who runs one process; empty strings where unknown."""

    pid: int
    pod: str = ""
    namespace: str = ""
    container: str = ""
    pod_uid: str = ""
    container_id: str = ""
    slurm_job: str = ""
    #: The process environment; ``None`` when it could not be read (gone or no
    #: access). It may hold secrets: never exported, logged or shown in repr.
    environ: Mapping[str, str] | None = field(default=None, repr=False)


def read_environ(proc_root: Path, pid: int) -> dict[str, str] | None:
    """The environment of ``pid`` from ``<proc>/<pid>/environ``.

    ``None`` when the process is gone. Raises ``EnvironUnreadable`` when the
    file exists but cannot be read (another user's process without
    ``CAP_SYS_PTRACE`` gives ``EACCES``). Entries without ``=`` are skipped; bytes are decoded
    as UTF-8 with replacement.
    """
    try:
        with (proc_root / str(pid) / "environ").open("rb") as handle:
            data = handle.read(MAX_ENVIRON_BYTES)
    except (FileNotFoundError, ProcessLookupError):  # gone, or exited between open and read
        return None
    except OSError as error:  # EACCES/EPERM without ptrace access, or anything odd
        raise EnvironUnreadable(f"pid {pid}: {error.strerror or error}") from None
    environ: dict[str, str] = {}
    for entry in data.split(b"\0"):
        name, separator, value = entry.partition(b"=")
        if separator and name:
            environ[name.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return environ


class ProcessAttributor:
    """Reads who runs a process from ``/proc`` and, optionally, the kubelet."""

    def __init__(self, proc_root: Path, pods: KubeletPodDirectory | None = None) -> None:
        self._proc = proc_root
        self._pods = pods
        self._unreadable_warned = LogThrottle(None)  # once at warning level, then debug

    def attribute(self, pid: int) -> ProcessAttribution:
        """Everything known about ``pid``; a vanished process gives only its PID."""
        try:
            cgroup = (self._proc / str(pid) / "cgroup").read_text(errors="replace")
        except OSError as error:
            log.debug("cannot read the cgroup of pid %d: %s", pid, error.strerror or error)
            cgroup = ""
        facts = parse_cgroup(cgroup)
        environ = self._environ(pid)
        slurm_job = facts.slurm_job or (environ or {}).get("SLURM_JOB_ID", "").strip()
        pod = namespace = container = ""
        if facts.pod_uid and self._pods is not None:
            names = self._pods.lookup(facts.pod_uid, facts.container_id)
            if names is not None:
                pod, namespace = names.name, names.namespace
                container = names.containers.get(facts.container_id, "")
        return ProcessAttribution(
            pid=pid,
            pod=pod,
            namespace=namespace,
            container=container,
            pod_uid=facts.pod_uid,
            container_id=facts.container_id,
            slurm_job=slurm_job if slurm_job.isdigit() else "",
            environ=environ,
        )

    def _environ(self, pid: int) -> dict[str, str] | None:
        try:
            return read_environ(self._proc, pid)
        except EnvironUnreadable as error:
            # Warn once: without ptrace access every process would repeat it.
            first = self._unreadable_warned.allow("environ")
            level = logging.WARNING if first else logging.DEBUG
            log.log(
                level,
                "cannot read the environment of %s; Slurm job ids from SLURM_JOB_ID and NCCL "
                "checks need CAP_SYS_PTRACE (or running as the process's user)", error,
            )
            return None
