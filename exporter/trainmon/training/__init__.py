"""Training telemetry in the daemon: the step protocol, its receiver and the per-job store.

``protocol`` is standard-library only, because the training-side client
(``trainmon.client``) shares its constants and encoder; ``receiver`` and
``store`` are daemon-only; ``writers`` names who sent a line (socket uid,
bearer token, kernel-named loopback user), which the store's ownership rule
and caps use (docs/security.md).
"""
