"""Who holds each GPU: the evidence behind ``idle_allocated`` and a job's team (issue 26).

The GPU-second ledger books a rank's time from its reports; a GPU that a job's
process holds while no rank of that job reports on it (a notebook left open,
a crashed rank that keeps its CUDA context, the time between two runs) shows
only in NVML's process list. The ledger collector (``trainmon.collectors.ledger``)
reads that list with each process's user and environment and hands the
recorder a ``GpuHolding`` per (GPU, process); this module is the shape of that
evidence and the rules that name a job's team:

- a Kubernetes **namespace** (the process's cgroup and the kubelet's pod list),
- else a Slurm **account** (``SLURM_JOB_ACCOUNT`` in the process environment),
- else the **user** who runs the process (or owns the job's reports: ``uid:<n>``
  as a user name, ``token:<name>`` as the token's name).

A GPU the kubelet allocated to a pod that runs no process on it (a notebook that
reserved one before starting its kernel, a crashed rank's pod) is held too: by
``pod_holding``, booked only while no process holds the GPU and no rank reports on it.

The team labels ``trainmon_job_team_info``, never the counters, so a job that
moves between teams does not split its series (docs/metrics.md).
"""

from __future__ import annotations

import pwd
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

#: The environment variable that names a Slurm job's account.
SLURM_ACCOUNT_VARIABLE = "SLURM_JOB_ACCOUNT"


@dataclass(frozen=True)
class GpuHolding:
    """One compute process on one GPU, and whose it is."""

    #: NVML index of the GPU.
    gpu: int
    #: Host PID of the process.
    pid: int
    #: The process's user (the owner of ``/proc/<pid>``); None when it is gone.
    uid: int | None
    #: The job it would report for (``trainmon.training.protocol.job_name``); None
    #: when its environment cannot be read.
    job: str | None
    #: Its team (module docstring), "" when nothing tells.
    team: str
    #: The writer identity it is booked for where no process tells one: a GPU the kubelet
    #: allocated to a pod that runs nothing on it (``pod_holding``); None for a process.
    owner: str | None = None


def pod_holding(gpu: int, namespace: str, pod: str) -> GpuHolding:
    """A GPU allocated to a pod with no process on it (the kubelet's pod-resources API),
    held by the pseudo-job ``pod:<namespace>/<pod>`` (the diagnosis' name for a pod that
    reports no steps), owned by that name, of the pod's namespace's team."""
    name = f"pod:{namespace}/{pod}"
    return GpuHolding(gpu=gpu, pid=0, uid=None, job=name, team=namespace, owner=name)


#: The GPUs' holdings now (read at each tick of the recorder).
GpuHoldings = Callable[[], Sequence[GpuHolding]]


def team_of(namespace: str, environ: Mapping[str, str] | None, uid: int | None) -> str:
    """The team of a process: its namespace, else its Slurm account, else its user."""
    if namespace:
        return namespace
    account = (environ or {}).get(SLURM_ACCOUNT_VARIABLE, "").strip()
    if account:
        return account[:128]
    return "" if uid is None else user_name(uid)


def owner_team(owner: str) -> str:
    """The team of a job known only by the writer identity of its reports
    (``trainmon.training.writers``): the user of ``uid:<n>``, the name of ``token:<name>``,
    "" for in-process callers."""
    kind, _, name = owner.partition(":")
    if kind == "uid" and name.isdigit():
        return user_name(int(name))
    return name if kind == "token" else ""


def user_name(uid: int) -> str:
    """The login name of ``uid`` on this node, else ``uid:<n>`` (a container's user)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid:{uid}"
