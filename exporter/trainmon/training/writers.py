"""Writer identities: who sent a step report or run description.

Every report and run description reaches the store with the identity of its
sender, as the transport can vouch for it (docs/security.md):

- ``uid:<n>`` on the unix socket: the sender's user id from the kernel
  (``SCM_CREDENTIALS``), translated into the daemon's user namespace;
- ``token:<name>`` over HTTP: the name the token file gives the bearer token;
- ``uid:<n>`` over loopback HTTP without a token, where the kernel's socket
  table names the connecting process's user (only when
  ``collectors.training.loopback_without_token`` allows it);
- ``local`` for callers inside the daemon process (the demo's jobs, tests
  that feed a store directly).

The first identity that reports a job owns it until the job expires; other
identities may not report for it, unless they are trusted (root, ``local``
and ``collectors.training.trusted_writers``).
"""

from __future__ import annotations

#: In-process callers (the demo node's jobs): always trusted.
LOCAL_WRITER = "local"
#: The superuser on the unix socket: always trusted.
ROOT_WRITER = "uid:0"


def uid_writer(uid: int) -> str:
    """The identity of a local user: ``uid:1000``."""
    return f"uid:{uid}"


def token_writer(name: str) -> str:
    """The identity of a bearer token: ``token:ci``."""
    return f"token:{name}"


def writer_uid(writer: str) -> int | None:
    """The user id of a ``uid:<n>`` identity; None for any other."""
    prefix, _, number = writer.partition(":")
    return int(number) if prefix == "uid" and number.isdigit() else None
