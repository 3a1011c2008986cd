"""One collector per data source; see ``trainmon.core.collector.Collector`` for the contract.

A collector adapts its source's typed readings (``trainmon.node``,
``trainmon.gpu``, ``trainmon.training``, ``trainmon.tencent``...) to metric
families, and every exported name is spelled out in full where it is made.
Only ``trainmon.cli`` imports these modules; the sources never do
(``tests/core/test_layering.py``).
"""
