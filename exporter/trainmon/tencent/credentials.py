"""Where the puller's Tencent Cloud credentials and region come from.

Credentials are looked up in this order, the first complete source wins:

1. the configuration: ``secret_id`` plus ``secret_key`` (a ``${VAR}``
   reference) or ``secret_key_file`` (read at start and again after an
   authentication failure, so a rotated Kubernetes secret is picked up),
   with an optional ``session_token``;
2. the environment: ``TENCENTCLOUD_SECRET_ID`` and ``TENCENTCLOUD_SECRET_KEY``,
   with an optional ``TENCENTCLOUD_SESSION_TOKEN`` (the names the official
   SDKs and the ``tccli`` read);
3. the CAM role bound to the CVM the puller runs on, from the instance
   metadata service: ``/latest/meta-data/cam/security-credentials/`` lists the
   role, ``.../<role>`` returns ``TmpSecretId``, ``TmpSecretKey``, ``Token`` and
   ``ExpiredTime`` (Unix seconds). Temporary credentials are fetched again
   ``refresh_margin`` seconds before they expire; the token is sent as
   ``X-TC-Token``.

The region is the configured one, else the CVM's own region from
``/latest/meta-data/placement/region``.

Every metadata request goes through the one metadata client,
``trainmon.tencent.metadata.HTTPTransport`` (``trainmon.outbound``): the whole
request within ``METADATA_TIMEOUT_SECONDS`` (a service that trickles bytes
cannot hold the puller's start-up longer), bodies capped at
``MAX_METADATA_BODY_BYTES``, never through a proxy.

Secrets never leave this module except inside a ``Credential`` (whose repr
hides them) handed to the signer; error messages name sources, never values.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from trainmon import outbound
from trainmon.tencent.metadata import (
    BASE_PATH,
    DEFAULT_METADATA_URL,
    REGION,
    ROLES,
    HTTPTransport,
    MetadataError,
)

log = logging.getLogger(__name__)

#: Seconds one whole metadata request (connect to last body byte) may take: the
#: service answers in milliseconds on a CVM and does not exist anywhere else,
#: so waiting longer only delays start-up.
METADATA_TIMEOUT_SECONDS = 2.0
#: Longest metadata answer read, bytes (a credential document is ~1.5 KiB).
MAX_METADATA_BODY_BYTES = 64 * 1024
#: Fetch temporary credentials again this many seconds before they expire.
REFRESH_MARGIN_SECONDS = 300.0


class CredentialsUnavailable(Exception):
    """No source produced usable credentials (or the region is unknown)."""


@dataclass(frozen=True)
class Credential:
    """One SecretId/SecretKey pair, with the session token of temporary keys."""

    secret_id: str
    secret_key: str = field(repr=False)
    token: str | None = field(default=None, repr=False)
    #: Unix seconds after which temporary credentials stop working; None = never.
    expires_at: float | None = None


class CredentialProvider(Protocol):
    """Hands out the current credential; ``source`` is safe to log and show."""

    @property
    def source(self) -> str: ...

    def credential(self) -> Credential:
        """The credential to sign the next request with (may refresh it)."""
        ...

    def invalidate(self) -> None:
        """Forget cached material after an authentication failure."""
        ...


class StaticCredentials:
    """Long-lived keys from the configuration or the environment."""

    def __init__(self, source: str, load: Callable[[], Credential]) -> None:
        self._source = source
        self._load = load
        self._lock = threading.Lock()
        self._cached: Credential | None = None

    @property
    def source(self) -> str:
        return self._source

    def credential(self) -> Credential:
        with self._lock:
            if self._cached is None:
                self._cached = self._load()
            return self._cached

    def invalidate(self) -> None:
        with self._lock:
            self._cached = None


class MetadataService:
    """The CAM role and the region, read from the CVM instance metadata service
    (``http://metadata.tencentyun.com``) through ``trainmon.tencent.metadata``.

    ``fetch`` is the HTTP boundary (``trainmon.outbound.request``).
    """

    def __init__(
        self,
        base_url: str = DEFAULT_METADATA_URL,
        timeout: float = METADATA_TIMEOUT_SECONDS,
        *,
        fetch: outbound.Fetch = outbound.request,
    ) -> None:
        self._transport = HTTPTransport(
            base_url, timeout, fetch, max_body_bytes=MAX_METADATA_BODY_BYTES
        )
        self.base_url = self._transport.base_url

    def text(self, path: str) -> str:
        """GET ``path`` (under ``/latest/meta-data/``); raises CredentialsUnavailable when it
        cannot be read."""
        body = self._get(path)
        try:
            return body.decode("utf-8").strip()
        except UnicodeDecodeError:
            raise CredentialsUnavailable(
                f"metadata service returned non-UTF-8 text for {BASE_PATH}{path}"
            ) from None

    def region(self) -> str:
        """This CVM's region, e.g. ``ap-shanghai``."""
        region = self.text(REGION)
        if not region:
            raise CredentialsUnavailable("metadata service returned an empty region")
        return region

    def role_name(self) -> str:
        """The CAM role bound to this CVM (the first one listed)."""
        names = [line.strip() for line in self.text(ROLES).splitlines() if line.strip()]
        if not names:
            raise CredentialsUnavailable("no CAM role is bound to this CVM")
        return names[0]

    def role_credential(self, role: str) -> Credential:
        """Temporary credentials of ``role``."""
        path = ROLES + role
        try:
            payload = json.loads(self._get(path))
        except ValueError:  # not JSON, not UTF-8
            raise CredentialsUnavailable(
                f"metadata service returned non-JSON for {BASE_PATH}{path}"
            ) from None
        if not isinstance(payload, dict) or payload.get("Code") != "Success":
            code = payload.get("Code") if isinstance(payload, dict) else None
            raise CredentialsUnavailable(
                f"metadata service refused credentials for role {role!r} (code {code})"
            )
        try:
            return Credential(
                secret_id=str(payload["TmpSecretId"]),
                secret_key=str(payload["TmpSecretKey"]),
                token=str(payload["Token"]),
                expires_at=float(payload["ExpiredTime"]),
            )
        except (KeyError, TypeError, ValueError):
            raise CredentialsUnavailable(
                f"metadata credentials of role {role!r} lack TmpSecretId/TmpSecretKey/"
                "Token/ExpiredTime"
            ) from None

    def _get(self, path: str) -> bytes:
        """The body of a 200 answer to ``GET path``; else CredentialsUnavailable."""
        try:
            reply = self._transport.get(path)
        except MetadataError as error:
            if error.cause == "timeout":
                raise CredentialsUnavailable(
                    f"metadata service {self.base_url} gave no answer within "
                    f"{self._transport.timeout:g} s (Timeout)"
                ) from None
            raise CredentialsUnavailable(
                f"metadata service {self.base_url} unreachable ({error.cause})"
            ) from None
        if reply.status != 200:
            raise CredentialsUnavailable(
                f"metadata service answered HTTP {reply.status} for {BASE_PATH}{path}"
            )
        return reply.body


class CVMRoleCredentials:
    """Temporary keys of the CVM's CAM role, refreshed before they expire."""

    def __init__(
        self,
        metadata: MetadataService,
        role: str | None = None,
        clock: Callable[[], float] = time.time,
        refresh_margin: float = REFRESH_MARGIN_SECONDS,
    ) -> None:
        self._metadata = metadata
        self._role = role
        self._clock = clock
        self._margin = refresh_margin
        self._lock = threading.Lock()
        self._cached: Credential | None = None

    @property
    def source(self) -> str:
        return f"cvm-role:{self._role}" if self._role else "cvm-role"

    def credential(self) -> Credential:
        with self._lock:
            now = self._clock()
            cached = self._cached
            if cached is not None and (
                cached.expires_at is None or now < cached.expires_at - self._margin
            ):
                return cached
            try:
                if self._role is None:
                    self._role = self._metadata.role_name()
                self._cached = self._metadata.role_credential(self._role)
            except CredentialsUnavailable as error:
                if cached is not None and cached.expires_at is not None and now < cached.expires_at:
                    log.warning("cannot refresh CVM role credentials, keeping current: %s", error)
                    return cached
                raise
            log.info("fetched temporary credentials of CVM role %s", self._role)
            return self._cached

    def invalidate(self) -> None:
        with self._lock:
            self._cached = None


def resolve_credentials(
    *,
    secret_id: str | None,
    secret_key: str | None,
    secret_key_file: Path | None,
    session_token: str | None,
    role: str | None,
    environ: Mapping[str, str],
    metadata: MetadataService,
    clock: Callable[[], float] = time.time,
) -> CredentialProvider:
    """Pick the first source of the chain that is configured (see module doc).

    Config and environment keys are checked here; the metadata service is only
    asked when neither is set, and a CVM role is checked by fetching it once.
    """
    if secret_id and (secret_key or secret_key_file):
        config_id = secret_id

        def load_config() -> Credential:
            key = secret_key if secret_key else _read_secret_file(secret_key_file)
            return Credential(config_id, key, session_token or None)

        provider = StaticCredentials("config", load_config)
        provider.credential()  # a missing or empty key file fails now, not later
        return provider
    env_id = environ.get("TENCENTCLOUD_SECRET_ID", "")
    env_key = environ.get("TENCENTCLOUD_SECRET_KEY", "")
    if env_id and env_key:
        env_token = environ.get("TENCENTCLOUD_SESSION_TOKEN") or None
        return StaticCredentials("environment", lambda: Credential(env_id, env_key, env_token))
    provider_role = CVMRoleCredentials(metadata, role, clock)
    try:
        provider_role.credential()
    except CredentialsUnavailable as error:
        raise CredentialsUnavailable(
            "no Tencent Cloud credentials: none in the configuration, "
            "TENCENTCLOUD_SECRET_ID/TENCENTCLOUD_SECRET_KEY not set, and no CVM role "
            f"({error})"
        ) from None
    return provider_role


def resolve_region(configured: str | None, metadata: MetadataService) -> str:
    """The configured region, else this CVM's region from the metadata service."""
    if configured:
        return configured
    try:
        return metadata.region()
    except CredentialsUnavailable as error:
        raise CredentialsUnavailable(
            f"no region configured and the CVM metadata service cannot tell it ({error})"
        ) from None


def _read_secret_file(path: Path | None) -> str:
    if path is None:
        raise CredentialsUnavailable("secret_key_file is not set")
    try:
        value = path.read_text(encoding="utf-8").strip()
    except OSError as error:
        raise CredentialsUnavailable(
            f"cannot read secret_key_file {path}: {error.strerror or type(error).__name__}"
        ) from None
    if not value:
        raise CredentialsUnavailable(f"secret_key_file {path} is empty")
    return value
