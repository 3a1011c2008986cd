"""Grafana dashboards for trainmon, generated with Grafana's ``grafana-foundation-sdk``.

``python -m dashboards`` (or ``make generate``) writes the JSON committed under
``dashboards/dcgm/`` and ``dashboards/tencent-cloud/``; ``python -m dashboards
--check`` exits 1 when the committed files differ from what the code generates.
``docs/dashboards.md`` describes every dashboard and panel.

Modules: ``builder`` (``Board``: panel ids, layout, variables, links, JSON),
``panels`` (panel factories: datasource, units, descriptions, query letters),
``promql`` (shared selectors, recording rules and thresholds), ``training``,
``node``, ``fleet`` and ``goodput`` (GPU-hours; one dashboard each), ``buckets``
(each goodput bucket's runbook and explaining panel), ``variant`` (what
distinguishes a bundle variant), ``dcgm`` and ``tencent`` (each variant's
rows), ``reference`` (the panel reference in ``docs/dashboards.md``) and
``generate`` (write / check).
"""
