"""TLS and basic auth from an exporter-toolkit web-config file.

The file has the format node_exporter and dcgm-exporter read
(https://github.com/prometheus/exporter-toolkit/blob/master/docs/web-configuration.md)::

    tls_server_config:
      cert_file: /etc/trainmon/tls.crt
      key_file: /etc/trainmon/tls.key
      client_auth_type: RequireAndVerifyClientCert   # optional
      client_ca_file: /etc/trainmon/ca.crt           # optional
      min_version: TLS12                             # optional
    http_server_config:
      headers: {Strict-Transport-Security: max-age=31536000}
    basic_auth_users:
      prometheus: $2y$10$...                         # bcrypt hash

Options of the Go implementation that Python's ``ssl`` cannot honour the same
way (``cipher_suites``, ``curve_preferences``, ``client_allowed_sans``, inline
``cert``/``key``) are rejected with a clear error rather than ignored.
"""

from __future__ import annotations

import base64
import binascii
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from trainmon.section import ConfigError, Section

if TYPE_CHECKING:
    import ssl

#: The web config's TLS versions, by the name of their ``ssl.TLSVersion`` (``ssl`` itself,
#: with libssl and libcrypto, is imported only to make a context).
_TLS_VERSIONS = {"TLS10": "TLSv1", "TLS11": "TLSv1_1", "TLS12": "TLSv1_2", "TLS13": "TLSv1_3"}
#: Go's RequestClientCert and RequireAnyClientCert accept certificates nobody
#: verifies; Python's ssl module cannot, so they are rejected as unsupported.
_CLIENT_AUTH_TYPES = ("NoClientCert", "VerifyClientCertIfGiven", "RequireAndVerifyClientCert")
_UNSUPPORTED_TLS_KEYS = ("cipher_suites", "curve_preferences", "client_allowed_sans", "cert", "key")
_FORBIDDEN_HEADERS = {"content-type", "content-length", "content-encoding", "www-authenticate"}
#: Successful (user, password) checks remembered so that bcrypt's deliberate
#: slowness is paid once per credential, not once per scrape.
_AUTH_CACHE_SIZE = 256


@dataclass(frozen=True)
class TLSSettings:
    cert_file: Path
    key_file: Path
    client_auth_type: str = "NoClientCert"
    client_ca_file: Path | None = None
    #: The web config's names: ``TLS10`` … ``TLS13``.
    min_version: str = "TLS12"
    max_version: str | None = None

    def context(self) -> ssl.SSLContext:
        """A server-side context; raises ``ConfigError`` on unreadable files."""
        import ssl

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion[_TLS_VERSIONS[self.min_version]]
        if self.max_version is not None:
            context.maximum_version = ssl.TLSVersion[_TLS_VERSIONS[self.max_version]]
        try:
            context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as error:
            raise ConfigError(
                "tls_server_config.cert_file", f"cannot load certificate/key: {error}"
            ) from None
        if self.client_ca_file is not None:
            try:
                context.load_verify_locations(cafile=str(self.client_ca_file))
            except (OSError, ssl.SSLError) as error:
                raise ConfigError(
                    "tls_server_config.client_ca_file", f"cannot load CA file: {error}"
                ) from None
        context.verify_mode = {
            "NoClientCert": ssl.CERT_NONE,
            "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
            "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
        }[self.client_auth_type]
        return context


@dataclass(frozen=True)
class WebConfig:
    tls: TLSSettings | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    basic_auth_users: Mapping[str, bytes] = field(default_factory=dict, repr=False)


class BasicAuthenticator:
    """Checks ``Authorization: Basic`` headers against bcrypt hashes."""

    def __init__(self, users: Mapping[str, bytes]) -> None:
        self._users = dict(users)
        self._verified: OrderedDict[bytes, None] = OrderedDict()
        self._lock = threading.Lock()
        # Unknown users are checked against a configured hash, at its cost, so the
        # time of a rejection does not tell whether the name exists.
        self._decoy_hash = next(iter(self._users.values()), None)

    @property
    def required(self) -> bool:
        """Whether the web config has users (else ``check`` lets everyone in)."""
        return bool(self._users)

    def check(self, authorization: str | None) -> bool:
        if not self._users:
            return True
        import bcrypt  # here, not above: only basic auth needs it in memory

        if not authorization or not authorization.startswith("Basic "):
            return False
        try:
            decoded = base64.b64decode(authorization[6:].strip(), validate=True)
        except (binascii.Error, ValueError):
            return False
        user, separator, password = decoded.partition(b":")
        if not separator:
            return False
        stored = self._users.get(user.decode("utf-8", "replace"))
        import hashlib  # here: with basic auth only (libcrypto)

        key = hashlib.sha256(user + b"\0" + password + b"\0" + (stored or b"")).digest()
        with self._lock:
            if stored is not None and key in self._verified:
                self._verified.move_to_end(key)
                return True
        if stored is None:
            if self._decoy_hash is not None:
                bcrypt.checkpw(password, self._decoy_hash)
            return False
        if not bcrypt.checkpw(password, stored):
            return False
        with self._lock:
            self._verified[key] = None
            while len(self._verified) > _AUTH_CACHE_SIZE:
                self._verified.popitem(last=False)
        return True


def load_web_config(path: Path) -> WebConfig:
    """Parse and validate a web-config file; TLS files are loaded once to check them."""
    import yaml  # here, not above: a daemon without a web config never loads it

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise ConfigError("web_config_file", f"cannot read {path}: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise ConfigError("web_config_file", f"{path} is not valid YAML: {error}") from None
    root = Section(data)
    base = path.parent
    tls = _tls(root.section("tls_server_config"), base) if root.raw("tls_server_config") else None
    http = root.section("http_server_config")
    if http.raw("http2", False) not in (True, False):
        raise ConfigError("http_server_config.http2", "expected true or false")
    headers = http.string_map("headers")
    http.finish()
    for name in headers:
        if name.lower() in _FORBIDDEN_HEADERS:
            raise ConfigError(f"http_server_config.headers.{name}", "this header cannot be set")
    users = root.string_map("basic_auth_users")
    hashes: dict[str, bytes] = {}
    for user, hashed in users.items():
        if not hashed.startswith(("$2a$", "$2b$", "$2y$")):
            raise ConfigError(f"basic_auth_users.{user}", "expected a bcrypt hash ($2y$...)")
        hashes[user] = hashed.encode()
    root.finish()
    config = WebConfig(tls=tls, headers=headers, basic_auth_users=hashes)
    if tls is not None:
        tls.context()
    return config


def _tls(section: Section, base: Path) -> TLSSettings:
    for unsupported in _UNSUPPORTED_TLS_KEYS:
        if section.has(unsupported):
            section.raw(unsupported)
            raise ConfigError(section.key_path(unsupported), "is not supported by trainmon")
    section.raw("prefer_server_cipher_suites")  # a no-op in Go since 1.17 as well
    cert = section.optional_path("cert_file")
    key = section.optional_path("key_file")
    if cert is None or key is None:
        raise ConfigError(section.path, "cert_file and key_file are both required")
    client_auth = section.choice("client_auth_type", "NoClientCert", _CLIENT_AUTH_TYPES)
    client_ca = section.optional_path("client_ca_file")
    if client_auth in ("VerifyClientCertIfGiven", "RequireAndVerifyClientCert") and not client_ca:
        raise ConfigError(section.key_path("client_ca_file"), f"required by {client_auth}")
    minimum = section.choice("min_version", "TLS12", tuple(_TLS_VERSIONS))
    maximum = section.optional_string("max_version")
    if maximum is not None and maximum not in _TLS_VERSIONS:
        raise ConfigError(
            section.key_path("max_version"), f"expected one of {', '.join(_TLS_VERSIONS)}"
        )
    section.finish()
    return TLSSettings(
        cert_file=base / cert,
        key_file=base / key,
        client_auth_type=client_auth,
        client_ca_file=base / client_ca if client_ca else None,
        min_version=minimum,
        max_version=maximum or None,
    )
