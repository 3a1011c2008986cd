"""Helpers of the alerting tests: the shipped rule files and scripts (``bundle``), a real
Alertmanager and a webhook sink on loopback (``stack``)."""
