"""Pod UID → pod name, namespace and container names, from the kubelet's pod list.

Source: ``GET <kubelet_url>/pods`` — the kubelet's own ``PodList`` of the pods
bound to this node (``metadata.uid/name/namespace`` and
``status.containerStatuses[].{name,containerID}``, the latter as
``containerd://<64 hex>``). Two ways to reach it:

- the authenticated port, ``https://$(NODE_IP):10250``, with the pod's service
  account token (``token_file``, re-read on every request because projected
  tokens rotate) and RBAC ``get`` on ``nodes/proxy`` (``nodes/pods`` from
  Kubernetes 1.32); kubelet serving certificates are often self-signed, hence
  ``ca_file`` or ``insecure_skip_verify``;
- the read-only port, ``http://$(NODE_IP):10255``, where a cluster still
  enables it.

Each fetch is one ``trainmon.outbound`` request: the whole request within
``timeout_seconds`` (a kubelet that trickles bytes cannot hold the scrape
longer), at most ``MAX_POD_LIST_BYTES`` of body, never through a proxy.

Each pod's ``metadata.labels`` are kept too (at most ``MAX_LABELS_PER_POD``, values
cut at ``MAX_LABEL_VALUE_LENGTH``), for ``trainmon_pod_info``. Which GPUs the
kubelet allocated comes from its pod-resources socket instead
(``trainmon.attribution.podresources``).

A pod UID never changes its name, and a restarted container gets a new id, so
the list is fetched only when a UID or container id is not known yet, at most
once per ``refresh_seconds``; each fetch replaces the whole map (pods that left
the node are forgotten, memory stays bounded). Failures are logged once per
distinct error and leave names empty; attribution goes on with pod UIDs.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from trainmon import outbound

if TYPE_CHECKING:
    import ssl

log = logging.getLogger(__name__)

#: Longest pod list read, bytes (110 pods with sidecars are ~2-4 MiB).
MAX_POD_LIST_BYTES = 64 * 1024 * 1024

#: Pod labels kept per pod, and the longest label value kept (cut past it).
MAX_LABELS_PER_POD = 64
MAX_LABEL_VALUE_LENGTH = 256

#: Prefixes of ``containerID`` in pod status (``<runtime>://<id>``).
_RUNTIME_SEPARATOR = "://"


@dataclass(frozen=True)
class PodNames:
    """What the kubelet knows about one pod."""

    name: str
    namespace: str
    #: Container id (64 hex digits, no runtime prefix) → container name.
    containers: Mapping[str, str]
    #: The pod's labels (``metadata.labels``).
    labels: Mapping[str, str] = field(default_factory=dict)


class KubeletPodDirectory:
    """A cached, rate-limited view of the kubelet's ``/pods`` list.

    ``timeout_seconds`` bounds each whole fetch; ``fetch`` is the HTTP boundary
    (``trainmon.outbound.request``).
    """

    def __init__(
        self,
        url: str,
        *,
        token_file: Path | None = None,
        ca_file: Path | None = None,
        insecure_skip_verify: bool = False,
        refresh_seconds: float = 30.0,
        timeout_seconds: float = 5.0,
        fetch: outbound.Fetch = outbound.request,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url.rstrip("/")
        self._token_file = token_file
        self._ca_file = ca_file
        self._insecure = insecure_skip_verify
        self._context: ssl.SSLContext | None = None
        self._refresh_seconds = refresh_seconds
        self._timeout = timeout_seconds
        self._request = fetch
        self._clock = clock
        self._pods: dict[str, PodNames] = {}
        self._by_name: dict[tuple[str, str], PodNames] = {}
        self._next_fetch = float("-inf")
        self._last_error: str | None = None
        self.fetches = {"ok": 0, "error": 0}

    @property
    def last_error(self) -> str | None:
        """The error of the latest failed fetch, ``None`` after a success."""
        return self._last_error

    @property
    def pod_count(self) -> int:
        return len(self._pods)

    def lookup(self, pod_uid: str, container_id: str = "") -> PodNames | None:
        """Names of the pod with ``pod_uid``; fetches the list when it (or the container) is new."""
        known = self._pods.get(pod_uid)
        if known is not None and (not container_id or container_id in known.containers):
            return known
        now = self._clock()
        if now >= self._next_fetch:
            self._next_fetch = now + self._refresh_seconds
            self._fetch()
        return self._pods.get(pod_uid)

    def lookup_name(self, namespace: str, name: str) -> PodNames | None:
        """The pod ``namespace/name``; fetches the list (rate-limited) when it is new."""
        known = self._by_name.get((namespace, name))
        if known is None:
            now = self._clock()
            if now >= self._next_fetch:
                self._next_fetch = now + self._refresh_seconds
                self._fetch()
            known = self._by_name.get((namespace, name))
        return known

    def _fetch(self) -> None:
        headers = {"Accept": "application/json"}
        try:
            if self._token_file is not None:
                token = self._token_file.read_text(encoding="utf-8").strip()
                headers["Authorization"] = f"Bearer {token}"
            response = self._request(
                "GET", f"{self.url}/pods", headers=headers, timeout=self._timeout,
                max_body_bytes=MAX_POD_LIST_BYTES, ssl_context=self._tls(),
            )
            if response.status != 200:
                raise ValueError(f"HTTP {response.status} {response.reason}")
            pods = parse_pod_list(json.loads(response.body))
        except (OSError, outbound.OutboundError, ValueError) as error:
            self.fetches["error"] += 1
            message = f"cannot list pods from the kubelet at {self.url}/pods: {error}"
            if message != self._last_error:
                log.warning("%s; pod and container names stay empty", message)
            self._last_error = message
            return
        self.fetches["ok"] += 1
        if self._last_error is not None:
            log.info("kubelet pod list at %s/pods readable again", self.url)
        self._last_error = None
        self._pods = pods
        self._by_name = {(pod.namespace, pod.name): pod for pod in pods.values()}


    def _tls(self) -> ssl.SSLContext | None:
        """The TLS settings for an ``https://`` kubelet (built once); None for http."""
        if not self.url.startswith("https:"):
            return None
        if self._context is None:
            import ssl  # here: for an https kubelet only (libssl, libcrypto)

            context = ssl.create_default_context(
                cafile=str(self._ca_file) if self._ca_file and not self._insecure else None
            )
            if self._insecure:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            self._context = context
        return self._context


def parse_pod_list(document: object) -> dict[str, PodNames]:
    """Pod UID → names, from a kubelet ``PodList`` JSON document.

    Raises ``ValueError`` when the document is not a ``PodList``-shaped mapping;
    individual malformed pods are skipped.
    """
    if not isinstance(document, Mapping) or not isinstance(document.get("items"), list):
        raise ValueError("the response is not a PodList (no items list)")
    pods: dict[str, PodNames] = {}
    for item in document["items"]:
        if not isinstance(item, Mapping):
            continue
        metadata = item.get("metadata")
        if not isinstance(metadata, Mapping):
            continue
        uid, name, namespace = (metadata.get(key) for key in ("uid", "name", "namespace"))
        if not (isinstance(uid, str) and isinstance(name, str) and isinstance(namespace, str)):
            continue
        pods[uid] = PodNames(name, namespace, _containers(item.get("status")),
                             _labels(metadata.get("labels")))
    return pods


def _labels(labels: object) -> dict[str, str]:
    """The string labels of a pod, bounded (module docstring)."""
    if not isinstance(labels, Mapping):
        return {}
    kept: dict[str, str] = {}
    for key, value in labels.items():
        if len(kept) >= MAX_LABELS_PER_POD:
            break
        if isinstance(key, str) and isinstance(value, str):
            kept[key] = value[:MAX_LABEL_VALUE_LENGTH]
    return kept


def _containers(status: object) -> dict[str, str]:
    """Container id → name over regular, init and ephemeral container statuses."""
    containers: dict[str, str] = {}
    if not isinstance(status, Mapping):
        return containers
    for key in ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses"):
        statuses = status.get(key)
        if not isinstance(statuses, list):
            continue
        for entry in statuses:
            if not isinstance(entry, Mapping):
                continue
            name, container_id = entry.get("name"), entry.get("containerID")
            if isinstance(name, str) and isinstance(container_id, str) and container_id:
                containers[container_id.rpartition(_RUNTIME_SEPARATOR)[2]] = name
    return containers
