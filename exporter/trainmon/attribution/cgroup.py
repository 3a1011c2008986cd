"""What a process's cgroup path says about who runs it: pod, container, Slurm job.

Source: ``/proc/<pid>/cgroup`` (``proc(5)``), one line per hierarchy,
``hierarchy-ID:controller-list:cgroup-path``. Under cgroup v1 there is one line
per controller (``4:memory:/kubepods/...``); under cgroup v2 a single
``0::/path`` line. The path is written by whoever created the cgroup, so each
runtime has its own spelling:

==========================  ==================================================================
who                         path (examples, one line each)
==========================  ==================================================================
kubelet, cgroupfs driver    ``/kubepods/burstable/pod6b3c…-…/0123…ef`` (v1 and v2;
                            guaranteed pods sit directly under ``/kubepods``)
kubelet, systemd driver     ``/kubepods.slice/kubepods-burstable.slice/``
                            ``kubepods-burstable-pod6b3c…_….slice/cri-containerd-0123…ef.scope``
                            (dashes of the pod UID
                            become ``_``; ``docker-…``, ``crio-…`` for other runtimes)
containerd nested paths     ``/system.slice/containerd.service/kubepods-…-pod6b3c…_….slice:``
                            ``cri-containerd:0123…ef`` (kubelet inside a container, e.g. kind)
plain Docker                ``/docker/0123…ef`` (v1), ``/system.slice/docker-0123…ef.scope`` (v2)
Slurm (cgroup plugin)       ``/slurm/uid_1000/job_4242/step_0/task_0`` (v1),
                            ``/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0`` (v2)
==========================  ==================================================================

A container id is the runtime's 64 hex digits. CRI-O's ``crio-conmon-<id>``
scope holds the monitor process, not the container, and gives no container
id. A process that sees its own cgroup namespace (``0::/``) tells nothing;
the daemon must read the host's ``/proc`` (``hostPID`` or ``/host/proc``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: A Kubernetes pod UID in a path segment: ``pod<uid>`` with ``-`` or (systemd) ``_``.
_POD_UID = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
    r"(?:\.slice)?(?=$|[/:])"
)
#: A container id: 64 hex digits after a runtime prefix or as a whole segment.
_CONTAINER_ID = re.compile(
    r"(?:^|/|docker-|cri-containerd-|crio-|containerd-|libpod-|:cri-containerd:|:docker:|:crio:)"
    r"([0-9a-f]{64})(?:\.scope)?(?=$|/)"
)
#: A Slurm job: ``job_<id>`` as a whole path segment.
_SLURM_JOB = re.compile(r"(?:^|/)job_(\d+)(?=$|/)")


@dataclass(frozen=True)
class CgroupFacts:
    """Identity read from one process's cgroup file; empty strings where unknown."""

    pod_uid: str = ""
    container_id: str = ""
    slurm_job: str = ""


def cgroup_paths(text: str) -> list[str]:
    """The cgroup paths of a ``/proc/<pid>/cgroup`` file, v2 line first.

    Malformed lines are skipped. The v2 line (``0::``) goes first because under
    a hybrid hierarchy it is the one systemd and kubelet keep current.
    """
    unified: list[str] = []
    legacy: list[str] = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[2].startswith("/"):
            continue
        hierarchy, controllers, path = parts
        (unified if hierarchy == "0" and controllers == "" else legacy).append(path)
    return unified + legacy


def parse_cgroup(text: str) -> CgroupFacts:
    """Pod UID, container id and Slurm job found in a ``/proc/<pid>/cgroup`` file.

    Each fact is taken from the first path (v2 first, then v1 lines in file
    order) that has it, so a hybrid host whose v2 line is just ``/`` still gives
    the pod from its v1 controller lines.
    """
    pod_uid = container_id = slurm_job = ""
    for path in cgroup_paths(text):
        if not pod_uid and (match := _POD_UID.search(path)):
            pod_uid = match.group(1).replace("_", "-")
        if not container_id and "crio-conmon-" not in path:
            containers = _CONTAINER_ID.findall(path)
            if containers:
                container_id = containers[-1]  # the innermost one
        if not slurm_job and (match := _SLURM_JOB.search(path)):
            slurm_job = match.group(1)
    return CgroupFacts(pod_uid=pod_uid, container_id=container_id, slurm_job=slurm_job)
