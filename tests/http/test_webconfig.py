"""Parsing the exporter-toolkit web-config file."""

from __future__ import annotations

import ssl
from pathlib import Path

import bcrypt
import pytest

from trainmon.http.webconfig import BasicAuthenticator, load_web_config
from trainmon.section import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "web.yml"
    path.write_text(text)
    return path


def test_full_file_with_relative_paths(tmp_path: Path, tls_files: dict[str, Path]) -> None:
    for name, source in tls_files.items():
        (tmp_path / name).write_bytes(source.read_bytes())
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode()
    config = load_web_config(
        write(
            tmp_path,
            f"""
tls_server_config:
  cert_file: server.crt
  key_file: server.key
  client_auth_type: VerifyClientCertIfGiven
  client_ca_file: ca.crt
  min_version: TLS13
http_server_config:
  http2: true
  headers: {{X-Content-Type-Options: nosniff}}
basic_auth_users:
  prometheus: '{hashed}'
""",
        )
    )
    assert config.tls is not None
    assert config.tls.cert_file == tmp_path / "server.crt"
    assert config.tls.min_version == "TLS13"
    assert config.tls.context().verify_mode == ssl.CERT_OPTIONAL
    assert config.tls.context().minimum_version == ssl.TLSVersion.TLSv1_3
    assert config.headers == {"X-Content-Type-Options": "nosniff"}
    assert "pw" not in repr(config) and hashed not in repr(config)
    authenticator = BasicAuthenticator(config.basic_auth_users)
    assert authenticator.check("Basic cHJvbWV0aGV1czpwdw==")  # prometheus:pw
    assert not authenticator.check("Basic !!notbase64")
    assert not authenticator.check("Basic cHJvbWV0aGV1cw==")  # no colon
    assert not authenticator.check("Bearer x")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "tls_server_config: {cert_file: a.crt}",
            "tls_server_config: cert_file and key_file are both required",
        ),
        (
            "tls_server_config: {cert_file: a, key_file: b, cipher_suites: [x]}",
            "tls_server_config.cipher_suites: is not supported",
        ),
        (
            "tls_server_config: {cert_file: a, key_file: b, client_auth_type: RequireAnyClientCert}",
            "tls_server_config.client_auth_type: expected one of",
        ),
        (
            "tls_server_config: {cert_file: a, key_file: b, client_auth_type: RequireAndVerifyClientCert}",
            "tls_server_config.client_ca_file: required by RequireAndVerifyClientCert",
        ),
        (
            "tls_server_config: {cert_file: a, key_file: b, min_version: SSL3}",
            "min_version: expected one of",
        ),
        (
            "tls_server_config: {cert_file: missing.crt, key_file: missing.key}",
            "cannot load certificate/key",
        ),
        ("basic_auth_users: {admin: plaintext}", "basic_auth_users.admin: expected a bcrypt hash"),
        ("http_server_config: {headers: {Content-Type: x}}", "this header cannot be set"),
        ("tls_config: {}", "tls_config: unknown key"),
        ("[unbalanced", "is not valid YAML"),
    ],
)
def test_invalid_web_configs(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        load_web_config(write(tmp_path, text))


def test_missing_web_config(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="web_config_file: cannot read"):
        load_web_config(tmp_path / "nope.yml")
