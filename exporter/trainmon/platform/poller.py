"""The background thread that knows the platform: provider, identity, spot reclaim.

Nothing here runs on a scrape and nothing blocks the daemon's start: the
thread detects the provider, then polls the metadata service; ``state()``
hands the collector a consistent snapshot.

**Provider.** ``provider: tencent`` or ``self-hosted`` in the configuration
wins. ``auto``: Tencent when DMI names Tencent Cloud as the vendor
(``trainmon.platform.dmi``), else when the metadata service answers a valid
instance id within the timeout (one probe, ~1 s at most on a machine where
``metadata.tencentyun.com`` does not resolve or answer); otherwise
self-hosted, probed again every ``identity_interval_seconds`` in case the
service was only late. A self-hosted node never counts metadata errors: no
service is the normal answer there.

**Polling (Tencent).** Every ``spot_interval_seconds`` (5 s) the thread reads
``instance-id`` and ``spot/termination-time``; every
``identity_interval_seconds`` (600 s) the identity (region, zone, instance
type, billing mode). Tencent announces a reclaim two minutes ahead ("Two
minutes before the interruption, we will notify you in the form of metadata",
https://intl.cloud.tencent.com/document/product/213/17817, FAQ "How do I know
that an instance is about to be interrupted?"); a 5 s poll plus a 15 s scrape
and a 30 s rule evaluation leave the job most of those 120 s for a last
checkpoint. The instance id read with every spot poll verifies that the
answering service is this instance's: a proxy that answers 404 to every path
would otherwise read as "no reclaim" forever. An identity value that fails
its pattern (a zone of a shape not seen before) is an error, but the spot
poll of the same iteration still runs: a reclaim is never hidden behind a
label. Name resolution of ``metadata.tencentyun.com`` is the system
resolver's and not bounded by the timeout (``resolv.conf``: 5 s × 2 attempts
by default); on a self-hosted node without an answering DNS server the first
``trainmon_node_info`` appears after it, or at once with ``provider:
self-hosted``.

**What a failed poll does (no stale value kept as truth):**

- a 404 on ``spot/termination-time`` (after a valid instance id) clears the
  reclaim; a valid time sets it; nothing else does either;
- a failed spot poll (timeout, connection refused, 5xx, garbage, HTML) keeps
  the last *announced* reclaim only until its time has passed, then drops
  it: a failure never cancels a known reclaim and never invents one;
- identity values stay after a failure, since an instance's id, zone and
  type do not change while it runs; ``trainmon_platform_metadata_up`` 0 says
  they were not re-verified by the last poll;
- every failure counts in ``trainmon_platform_metadata_errors_total{reason}``,
  sets ``metadata_up`` to 0 until the next good poll, and is logged at most
  once per reason every five minutes (``LogThrottle``), or at once when its
  message changes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from trainmon.background import BackgroundThread
from trainmon.logthrottle import LogThrottle
from trainmon.platform.config import CONFIGURABLE_IDENTITY, PlatformConfig, Provider
from trainmon.platform.dmi import DMIIdentity
from trainmon.tencent.metadata import (
    ERROR_REASONS,
    ErrorReason,
    Identity,
    MetadataError,
    TencentMetadata,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlatformState:
    """One consistent snapshot of what the poller knows."""

    #: ``None`` until the first detection finished.
    provider: Provider | None
    #: How the provider was decided: ``config``, ``dmi``, ``metadata`` or
    #: ``no metadata service (<reason>)``.
    provider_source: str
    #: Validated metadata identity (Tencent); ``None`` before the first good read.
    identity: Identity | None
    #: 1 spot / 0 not spot / ``None`` unknown (see ``PlatformPoller.state``).
    spot: bool | None
    #: Unix seconds of the announced reclaim; ``None`` when none is scheduled.
    termination_time: float | None
    #: ``None`` until the first poll of a Tencent node (or on self-hosted nodes).
    metadata_up: bool | None
    errors: Mapping[ErrorReason, int] = field(default_factory=dict)
    #: Monotonic seconds of the last poll that succeeded (for its age).
    last_success: float | None = None
    last_error: str | None = None


class PlatformPoller:
    """Detects the provider and polls the metadata service in a background thread.

    ``poll()`` runs one iteration synchronously (the thread calls it in a
    loop; tests may call it directly).
    """

    def __init__(
        self,
        config: PlatformConfig,
        metadata: TencentMetadata,
        dmi: Callable[[], DMIIdentity],
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._config = config
        self._metadata = metadata
        self._dmi = dmi
        self._clock = clock
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._throttle = LogThrottle(clock=monotonic)
        self._thread = BackgroundThread("platform-metadata", self._run)
        self._provider: Provider | None = None
        self._provider_source = "detecting"
        self._identity: Identity | None = None
        self._termination: float | None = None
        self._up: bool | None = None
        self._errors: dict[ErrorReason, int] = dict.fromkeys(ERROR_REASONS, 0)
        self._last_success: float | None = None
        self._last_error: str | None = None
        #: Monotonic time after which the identity (or, self-hosted under
        #: ``auto``, the metadata probe) is read again.
        self._identity_due = 0.0
        #: True once the first ``poll()`` returned.
        self._settled = False

    # -- lifecycle ---------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._thread.stop()

    def _run(self) -> None:
        while not self._thread.stopping.is_set():
            started = self._monotonic()
            try:
                self.poll()
            except Exception:  # the thread must outlive a bad poll (a reclaim may follow)
                if self._throttle.allow("poll-crash"):
                    log.exception("platform: polling the metadata service failed")
            elapsed = self._monotonic() - started
            self._thread.stopping.wait(max(0.1, self._config.spot_interval_seconds - elapsed))

    # -- one iteration -----------------------------------------------------------

    def poll(self) -> None:
        """Detect the provider if needed, then poll what is due.

        ``state()`` shows no provider until the first call has returned, so
        that a scrape in between never sees a Tencent node without its identity.
        """
        try:
            self._poll(self._monotonic())
        finally:
            with self._lock:
                self._settled = True

    def _poll(self, now: float) -> None:
        if self._provider is None:
            self._detect()
        elif (
            self._provider == "self-hosted"
            and self._config.provider == "auto"
            and now >= self._identity_due
        ):
            self._detect()  # a service that was only late at start
        if self._provider != "tencent":
            return
        failure = None
        if self._identity is None or now >= self._identity_due:
            failure = self._poll_identity()
            if failure is not None and failure.reason in ("timeout", "unreachable"):
                return  # the service is down: one failure per iteration is enough
        # a value the identity rejected (a zone of an unknown shape) must not
        # hide a reclaim: the spot poll still runs, but the poll is not all valid
        self._poll_spot(verified=failure is None)

    def _detect(self) -> None:
        provider: Provider
        configured = self._config.provider
        if configured != "auto":
            provider, source = configured, "config"
        elif self._dmi().tencent:
            provider, source = "tencent", "dmi"
        else:
            try:
                self._metadata.instance_id()
                provider, source = "tencent", "metadata"
            except MetadataError as error:
                provider, source = "self-hosted", f"no metadata service ({error.reason})"
                self._identity_due = self._monotonic() + self._config.identity_interval_seconds
        changed = provider != self._provider
        with self._lock:
            self._provider, self._provider_source = provider, source
        if changed:
            log.info("platform: provider %s (%s)", provider, source)
            if provider == "tencent" and set(self._config.labels) & CONFIGURABLE_IDENTITY:
                log.warning(
                    "platform: collectors.platform.labels sets zone/region/instance_type, but "
                    "on Tencent Cloud they come from the metadata service; the configured "
                    "values are ignored"
                )

    def _poll_identity(self) -> MetadataError | None:
        """Read the identity; the error, counted, if that failed."""
        self._identity_due = self._monotonic() + self._config.identity_interval_seconds
        try:
            identity = self._metadata.identity()
        except MetadataError as error:
            self._failed(error)
            return error
        previous = self._identity
        if previous is not None and previous.instance_id != identity.instance_id:
            # a different instance answers: a moved disk image, a misrouted
            # request; not this machine's identity, and not re-verified.
            changed = MetadataError(
                "invalid",
                f"instance-id changed from {previous.instance_id} to {identity.instance_id}",
            )
            self._failed(changed)
            return changed
        with self._lock:
            self._identity = identity
        if previous != identity:
            log.info(
                "platform: Tencent Cloud instance %s (%s) in %s, billing %s",
                identity.instance_id, identity.instance_type or "type unknown",
                identity.zone, identity.charge_type or "unknown",
            )
        return None

    def _poll_spot(self, *, verified: bool = True) -> None:
        """Read the reclaim; ``verified``: the identity read of this iteration (if any) passed."""
        try:
            instance_id = self._metadata.instance_id()
            known = self._identity
            if known is not None and instance_id != known.instance_id:
                raise MetadataError(
                    "invalid",
                    f"instance-id {instance_id} is not this instance ({known.instance_id})",
                )
            termination = self._metadata.termination_time()
        except MetadataError as error:
            self._failed(error)
            return
        previous = self._termination
        with self._lock:
            self._termination = termination
            self._up = verified
            if verified:
                self._last_success = self._monotonic()
        if termination is not None and termination != previous:
            log.warning(
                "platform: spot reclaim scheduled for %s (in %.0f s)",
                time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(termination)),
                termination - self._clock(),
            )
        elif termination is None and previous is not None:
            log.info("platform: the scheduled spot reclaim was withdrawn")
        if any([self._throttle.forget(reason) for reason in ERROR_REASONS]):
            log.info("platform: the metadata service answers again")

    def _failed(self, error: MetadataError) -> None:
        now = self._clock()
        with self._lock:
            self._up = False
            self._errors[error.reason] += 1
            self._last_error = f"{error.reason}: {error}"
            if self._termination is not None and now > self._termination:
                self._termination = None  # its time has passed; no longer "announced"
        held_back = self._throttle.admit(error.reason, str(error))
        if held_back is not None:
            log.warning(
                "platform: metadata service %s: %s: %s%s",
                self._config.metadata_url, error.reason, error,
                f" ({held_back} more since the last report)" if held_back else "",
            )

    # -- reading -----------------------------------------------------------------

    def state(self) -> PlatformState:
        """The current snapshot.

        ``spot``: the ``spot`` configuration override when set; else 0 on a
        self-hosted node; on Tencent 1 while a reclaim is announced (only
        spot instances are reclaimed), else from the billing mode
        (``SPOTPAID``), ``None`` while that is unknown.
        """
        with self._lock:
            identity = self._identity
            termination = self._termination
            spot: bool | None
            if self._config.spot is not None:
                spot = self._config.spot
            elif self._provider == "self-hosted":
                spot = False
            elif termination is not None:
                spot = True
            else:
                spot = identity.spot if identity is not None else None
            provider = self._provider if self._settled else None
            return PlatformState(
                provider=provider,
                provider_source=self._provider_source if self._settled else "detecting",
                identity=identity,
                spot=spot,
                termination_time=termination,
                metadata_up=self._up if provider == "tencent" else None,
                errors=dict(self._errors),
                last_success=self._last_success,
                last_error=self._last_error,
            )
