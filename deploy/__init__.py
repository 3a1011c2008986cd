"""Deployment tooling that is not part of the installed package.

``python -m deploy.prometheusrule`` renders the Kubernetes PrometheusRule of
each bundle variant from ``alerts/``; ``python -m deploy.stack`` (``make
stack``) runs trainmon, Prometheus and Alertmanager on loopback.
"""
