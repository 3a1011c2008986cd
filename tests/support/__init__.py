"""Code shared by the test folders and the benchmarks: the running daemon, the
exposition parser, the Prometheus launcher, loopback servers and the fakes of the
sources below trainmon (NVML, the Tencent Cloud API and metadata service,
dcgm-exporter)."""
