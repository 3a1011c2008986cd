"""The kit the test folders and the benchmarks share (a top-level package, not shipped in
the wheel): the running daemon, the exposition parser, the Prometheus and VictoriaMetrics
launchers, loopback servers, the fakes of the sources below trainmon (NVML, the Tencent
Cloud API and metadata service, dcgm-exporter), the training jobs (``ddp_job``: every
DDP rank; ``torch_job``, ``tiny_trainer``, ``workloads``) and the readers of the
committed dashboards (``dashboard_files``, ``grafana_templating``, ``metric_contract``).

``bench/`` imports from here, never from ``tests/``."""
