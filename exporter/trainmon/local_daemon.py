"""Where this node's daemon answers, for the commands that read it (``doctor``,
``runs``, ``compare``) when no ``--url`` names one.

The address is the one the daemon would use: ``$TRAINMON_LISTEN`` when set (as
``trainmon serve`` reads it), else ``listen`` of the configuration file the
commands were given (``--config`` / ``$TRAINMON_CONFIG``, the file the daemon
reads), else the default ``:19400``; a wildcard host (``0.0.0.0``, ``::``) is
asked on loopback. Its step socket is ``collectors.training.socket`` of that
configuration, or the system socket ``/run/trainmon/steps.sock`` (a root
daemon's, as a user's client finds it: ``trainmon.paths``), whichever a daemon
has bound. Plain HTTP: a daemon behind TLS or basic auth (a web config) is read
with ``--url`` (``doctor``) or its ledger file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import requests

from trainmon.http.listen import DEFAULT_LISTEN, ListenAddress, parse_listen_address
from trainmon.paths import SYSTEM_SOCKET_PATH, socket_listening

#: Seconds the probe of ``answers`` waits for the daemon.
PROBE_TIMEOUT_SECONDS = 2.0
#: Hosts that mean "every interface": asked on loopback.
_WILDCARDS = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}


@dataclass(frozen=True)
class LocalDaemon:
    """The node daemon as this process expects to find it."""

    #: ``http://127.0.0.1:19400``; None when the port is 0 (chosen at start: unknown).
    url: str | None
    #: Where the address came from, in words (``listen of /etc/trainmon/trainmon.yml``).
    origin: str
    #: The step socket a running daemon holds, if any.
    socket: Path | None

    @classmethod
    def of(cls, listen: ListenAddress, step_socket: Path | None, config_path: Path | None,
           environ: Mapping[str, str]) -> LocalDaemon:
        """From the configuration the command loaded (its ``listen`` and
        ``collectors.training.socket``, read from ``config_path``) and the environment."""
        configured = listen
        listen_text = environ.get("TRAINMON_LISTEN", "")
        if listen_text:
            try:
                listen = parse_listen_address(listen_text)
                origin = f"TRAINMON_LISTEN={listen_text}"
            except ValueError:
                listen, origin = configured, f"listen {configured}"
        elif config_path is not None:
            origin = f"listen {configured} of {config_path}"
        else:
            listen = parse_listen_address(DEFAULT_LISTEN)
            origin = f"the default listen address :{listen.port}"
        candidates = [step_socket, SYSTEM_SOCKET_PATH]
        held = next((path for path in candidates
                     if path is not None and socket_listening(path)), None)
        return cls(url=loopback_url(listen), origin=origin, socket=held)


def loopback_url(listen: ListenAddress) -> str | None:
    """The URL that reaches a daemon listening on ``listen`` from this node."""
    if listen.port == 0:
        return None
    host = _WILDCARDS.get(listen.host, listen.host)
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{listen.port}"


def answers(url: str, session: requests.Session | None = None,
            timeout: float = PROBE_TIMEOUT_SECONDS) -> bool:
    """Whether an HTTP server answers ``url``/healthz at all (any status)."""
    get = session.get if session is not None else requests.get
    try:
        get(f"{url}/healthz", timeout=timeout).close()
    except requests.RequestException:
        return False
    return True
