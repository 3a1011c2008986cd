"""The configuration file: YAML → frozen objects, validated before anything binds.

``load_config(path)`` and ``parse_config(mapping)`` return a ``Config``; a
missing file (``path=None``) gives the built-in defaults, which start a useful
node daemon on any Linux machine. Errors are ``ConfigError`` with the key path.
The keys are documented in the README's configuration reference.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from exporter.settings import Auto, ConfigError, Section

DEFAULT_LISTEN = "0.0.0.0:19400"
DEFAULT_NETWORK_EXCLUDE = r"^(lo|veth.*|docker.*|cali.*|flannel.*|cni.*)$"


@dataclass(frozen=True)
class ListenAddress:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_listen_address(text: str) -> ListenAddress:
    """``host:port``, ``[v6]:port`` or ``:port`` (all interfaces)."""
    match = re.fullmatch(
        r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[^:\[\]]*)):(?P<port>\d{1,5})", text
    )
    if match is None:
        raise ValueError(f"expected host:port, [ipv6]:port or :port, got {text!r}")
    port = int(match.group("port"))
    if not 0 <= port <= 65535:
        raise ValueError(f"port must be 0-65535, got {port}")
    host = match.group("v6") or match.group("host") or "0.0.0.0"
    return ListenAddress(host, port)


@dataclass(frozen=True)
class HTTPConfig:
    """Limits that keep a slow or hostile client from stalling scrapes."""

    max_connections: int = 64
    read_timeout_seconds: float = 10.0
    max_request_body_bytes: int = 1 << 20


@dataclass(frozen=True)
class PathsConfig:
    proc: Path = Path("/proc")
    sys: Path = Path("/sys")


@dataclass(frozen=True)
class DeviceFilter:
    """Include/exclude regexes over device names (``fullmatch`` semantics via ``^$``)."""

    include: re.Pattern[str] | None = None
    exclude: re.Pattern[str] | None = None

    def accepts(self, name: str) -> bool:
        if self.include is not None and not self.include.search(name):
            return False
        return not (self.exclude is not None and self.exclude.search(name))


@dataclass(frozen=True)
class NetworkConfig:
    enabled: bool = True
    devices: DeviceFilter = DeviceFilter(exclude=re.compile(DEFAULT_NETWORK_EXCLUDE))


@dataclass(frozen=True)
class InfinibandConfig:
    enabled: bool | Auto = "auto"


@dataclass(frozen=True)
class DiskConfig:
    enabled: bool = True
    #: Applied after the built-in rule that drops partitions, loop, ram and zram.
    devices: DeviceFilter = DeviceFilter()


@dataclass(frozen=True)
class GPUConfig:
    enabled: bool | Auto = "auto"
    #: Sampler window, seconds; the sawtooth ratio looks at the last two windows.
    window_seconds: float = 60.0
    #: How often the sampler thread drains the driver's sample buffer.
    sample_interval_seconds: float = 1.0
    #: How often the process list (expensive) is read for attribution.
    process_interval_seconds: float = 15.0
    #: A utilization sample below this busy ratio (0-1) counts as idle.
    idle_threshold: float = 0.1
    #: A sample at or above this busy ratio puts the GPU in the busy state.
    busy_threshold: float = 0.5
    #: Seconds between attempts to (re)open NVML or to probe a lost GPU.
    retry_seconds: float = 10.0


@dataclass(frozen=True)
class TrainingConfig:
    enabled: bool = True
    socket: Path | None = Path("/run/trainmon/steps.sock")
    token_file: Path | None = None
    ttl_seconds: float = 300.0
    max_jobs: int = 64
    max_ranks_per_job: int = 1024
    #: Permission bits of the socket file; 0o666 lets any local user send (as
    #: loopback HTTP already does); use 0o660 with a shared group to restrict.
    socket_mode: int = 0o666
    #: Requested SO_RCVBUF of the socket (bytes); Linux caps it at rmem_max
    #: unless the daemon may use SO_RCVBUFFORCE (root / CAP_NET_ADMIN).
    receive_buffer_bytes: int = 4 << 20
    #: Span of trainmon_training_data_wait_ratio (seconds).
    window_seconds: float = 60.0
    #: Longest accepted job and phase name (characters).
    max_label_length: int = 128


@dataclass(frozen=True)
class TencentConfig:
    """The Cloud Monitor puller (docs/tencent-cloud.md has every key explained)."""

    enabled: bool = False
    #: Monitor API endpoint; cvm./cbs. hosts are derived from a monitor.* host.
    endpoint: str = "https://monitor.tencentcloudapi.com"
    #: None: this CVM's region from the metadata service.
    region: str | None = None
    #: Several regions (discovery only); overrides ``region``.
    regions: tuple[str, ...] = ()
    secret_id: str | None = field(default=None, repr=False)
    #: Only ever a ``${VAR}`` reference in the file (checked when parsing).
    secret_key: str | None = field(default=None, repr=False)
    secret_key_file: Path | None = None
    session_token: str | None = field(default=None, repr=False)
    #: CAM role of the CVM; None: the role the metadata service lists.
    role: str | None = None
    metadata_url: str = "http://metadata.tencentyun.com"
    instances: tuple[str, ...] = ()
    disks: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: Tag filters for DescribeInstances when ``instances`` is empty.
    discovery_tags: Mapping[str, str] = field(default_factory=dict)
    discover_disks: bool = True
    discovery_interval_seconds: float = 600.0
    #: Tencent metric names to pull; empty: the whole catalogue.
    metrics: tuple[str, ...] = ()
    period_seconds: int = 60
    delay_seconds: int = 120
    window_periods: int = 5
    batch_size: int = 10
    rate_limit: float = 15.0
    concurrency: int = 4
    request_timeout_seconds: float = 10.0
    max_retries: int = 2

    @property
    def target_regions(self) -> tuple[str | None, ...]:
        """The regions to pull; ``(None,)`` means "ask the metadata service"."""
        return self.regions or (self.region,)


@dataclass(frozen=True)
class AttributionConfig:
    """GPU process → pod/namespace/container or Slurm job (docs/diagnosis.md)."""

    enabled: bool = True
    #: Kubelet base URL for pod names (``https://$(NODE_IP):10250``); None: pod UIDs only.
    kubelet_url: str | None = None
    #: Bearer token file for the kubelet (a service account token, re-read on use).
    kubelet_token_file: Path | None = None
    kubelet_ca_file: Path | None = None
    kubelet_insecure_skip_verify: bool = False
    #: The pod list is fetched on an unknown pod, at most once per this many seconds.
    kubelet_refresh_seconds: float = 30.0
    kubelet_timeout_seconds: float = 5.0
    #: Check GPU processes' NCCL_* environment (trainmon_nccl_problem_info).
    nccl_checks: bool = True


@dataclass(frozen=True)
class DiagnosisConfig:
    """Thresholds of the compute/communication/storage/scheduling verdict (DESIGN §6).

    Every ratio is 0-1; docs/diagnosis.md gives the reasoning and sources.
    """

    enabled: bool = True
    #: Span of the evidence: counters are compared over this many seconds.
    window_seconds: float = 60.0
    #: Fewer steps than this in the window (all ranks together): kind ``none``.
    min_steps: int = 3
    #: storage: data wait / step time of the worst rank at or above this.
    data_wait_ratio: float = 0.2
    #: storage, second rule: a GPU sawtooth at or above this ...
    sawtooth_ratio: float = 0.5
    #: ... with a rising data wait that reached this.
    sawtooth_data_wait_ratio: float = 0.1
    #: communication: comm-phase time / step time of the median rank at or above this.
    comm_ratio: float = 0.3
    #: Phase names counted as communication.
    comm_phases: tuple[str, ...] = ("comm",)
    #: communication without a comm phase: a NIC or IB port this busy (of its link rate).
    link_utilization_ratio: float = 0.8
    #: scheduling: a rank whose per-step work (step - data wait - comm) is this many
    #: times the median of the other ranks' is a straggler.
    straggler_factor: float = 1.3
    #: A GPU whose mean utilization is below this is idle.
    idle_utilization_ratio: float = 0.05
    #: compute: below this GPU utilization the advice points at host-side overhead.
    busy_utilization_ratio: float = 0.6
    #: scheduling: a rank without a step for this long has stalled (seconds).
    stall_seconds: float = 120.0


@dataclass(frozen=True)
class CollectorsConfig:
    gpu: GPUConfig = GPUConfig()
    network: NetworkConfig = NetworkConfig()
    infiniband: InfinibandConfig = InfinibandConfig()
    disk: DiskConfig = DiskConfig()
    training: TrainingConfig = TrainingConfig()
    tencent: TencentConfig = TencentConfig()
    attribution: AttributionConfig = AttributionConfig()
    diagnosis: DiagnosisConfig = DiagnosisConfig()


@dataclass(frozen=True)
class Config:
    listen: ListenAddress = ListenAddress("0.0.0.0", 19400)
    web_config_file: Path | None = None
    http: HTTPConfig = HTTPConfig()
    paths: PathsConfig = PathsConfig()
    collectors: CollectorsConfig = CollectorsConfig()


def load_config(path: Path | None, environ: Mapping[str, str] | None = None) -> Config:
    """Read and validate ``path``; ``None`` gives the built-in defaults."""
    if path is None:
        return Config()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError("", f"cannot read {path}: {error.strerror or error}") from None
    except UnicodeDecodeError:
        raise ConfigError("", f"{path} is not UTF-8 text") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or str(error)
        raise ConfigError("", f"{path} is not valid YAML{where}: {problem}") from None
    return parse_config(data, environ)


def parse_config(data: object, environ: Mapping[str, str] | None = None) -> Config:
    root = Section(data, "", environ)
    config = Config(
        listen=root.parsed("listen", DEFAULT_LISTEN, parse_listen_address),
        web_config_file=root.optional_path("web_config_file"),
        http=_http(root.section("http")),
        paths=_paths(root.section("paths")),
        collectors=_collectors(root.section("collectors")),
    )
    root.finish()
    return config


def _http(section: Section) -> HTTPConfig:
    default = HTTPConfig()
    result = HTTPConfig(
        max_connections=section.integer("max_connections", default.max_connections, 1, 100_000),
        read_timeout_seconds=section.number(
            "read_timeout_seconds", default.read_timeout_seconds, 0.1, 3600
        ),
        max_request_body_bytes=section.integer(
            "max_request_body_bytes", default.max_request_body_bytes, 1024, 1 << 30
        ),
    )
    section.finish()
    return result


def _paths(section: Section) -> PathsConfig:
    result = PathsConfig(
        proc=section.path_value("proc", "/proc"), sys=section.path_value("sys", "/sys")
    )
    section.finish()
    return result


def _device_filter(section: Section, exclude_default: str | None) -> DeviceFilter:
    return DeviceFilter(
        include=section.regex("include", None), exclude=section.regex("exclude", exclude_default)
    )


def _collectors(section: Section) -> CollectorsConfig:
    result = CollectorsConfig(
        gpu=_gpu(section.section("gpu")),
        network=_network(section.section("network")),
        infiniband=_infiniband(section.section("infiniband")),
        disk=_disk(section.section("disk")),
        training=_training(section.section("training")),
        tencent=_tencent(section.section("tencent")),
        attribution=_attribution(section.section("attribution")),
        diagnosis=_diagnosis(section.section("diagnosis")),
    )
    section.finish()
    return result


def _attribution(section: Section) -> AttributionConfig:
    default = AttributionConfig()
    kubelet_url = section.optional_string("kubelet_url")
    if kubelet_url is not None and not re.fullmatch(r"https?://[^/\s]+/?", kubelet_url):
        raise ConfigError(
            section.key_path("kubelet_url"), f"expected http(s)://host:port, got {kubelet_url!r}"
        )
    result = AttributionConfig(
        enabled=section.boolean("enabled", default.enabled),
        kubelet_url=kubelet_url.rstrip("/") if kubelet_url else None,
        kubelet_token_file=section.optional_path("kubelet_token_file"),
        kubelet_ca_file=section.optional_path("kubelet_ca_file"),
        kubelet_insecure_skip_verify=section.boolean(
            "kubelet_insecure_skip_verify", default.kubelet_insecure_skip_verify
        ),
        kubelet_refresh_seconds=section.number(
            "kubelet_refresh_seconds", default.kubelet_refresh_seconds, 1, 3600
        ),
        kubelet_timeout_seconds=section.number(
            "kubelet_timeout_seconds", default.kubelet_timeout_seconds, 0.1, 60
        ),
        nccl_checks=section.boolean("nccl_checks", default.nccl_checks),
    )
    section.finish()
    return result


def _diagnosis(section: Section) -> DiagnosisConfig:
    default = DiagnosisConfig()

    def ratio(key: str, value: float) -> float:
        return section.number(key, value, 0, 1)

    result = DiagnosisConfig(
        enabled=section.boolean("enabled", default.enabled),
        window_seconds=section.number("window_seconds", default.window_seconds, 5, 3600),
        min_steps=section.integer("min_steps", default.min_steps, 1, 1_000_000),
        data_wait_ratio=ratio("data_wait_ratio", default.data_wait_ratio),
        sawtooth_ratio=ratio("sawtooth_ratio", default.sawtooth_ratio),
        sawtooth_data_wait_ratio=ratio(
            "sawtooth_data_wait_ratio", default.sawtooth_data_wait_ratio
        ),
        comm_ratio=ratio("comm_ratio", default.comm_ratio),
        comm_phases=section.string_list("comm_phases", default.comm_phases),
        link_utilization_ratio=ratio("link_utilization_ratio", default.link_utilization_ratio),
        straggler_factor=section.number("straggler_factor", default.straggler_factor, 1, 100),
        idle_utilization_ratio=ratio("idle_utilization_ratio", default.idle_utilization_ratio),
        busy_utilization_ratio=ratio("busy_utilization_ratio", default.busy_utilization_ratio),
        stall_seconds=section.number("stall_seconds", default.stall_seconds, 1, 86400),
    )
    section.finish()
    if result.idle_utilization_ratio >= result.busy_utilization_ratio:
        raise ConfigError(
            section.key_path("idle_utilization_ratio"),
            "must be below busy_utilization_ratio",
        )
    if not result.comm_phases:
        raise ConfigError(section.key_path("comm_phases"), "name at least one phase")
    return result


def _network(section: Section) -> NetworkConfig:
    result = NetworkConfig(
        enabled=section.boolean("enabled", True),
        devices=_device_filter(section, DEFAULT_NETWORK_EXCLUDE),
    )
    section.finish()
    return result


def _infiniband(section: Section) -> InfinibandConfig:
    result = InfinibandConfig(enabled=section.enabled("enabled", "auto"))
    section.finish()
    return result


def _disk(section: Section) -> DiskConfig:
    result = DiskConfig(
        enabled=section.boolean("enabled", True), devices=_device_filter(section, None)
    )
    section.finish()
    return result


def _gpu(section: Section) -> GPUConfig:
    default = GPUConfig()
    result = GPUConfig(
        enabled=section.enabled("enabled", "auto"),
        window_seconds=section.number("window_seconds", default.window_seconds, 5, 3600),
        sample_interval_seconds=section.number(
            "sample_interval_seconds", default.sample_interval_seconds, 0.1, 10
        ),
        process_interval_seconds=section.number(
            "process_interval_seconds", default.process_interval_seconds, 1, 3600
        ),
        idle_threshold=section.number("idle_threshold", default.idle_threshold, 0.01, 0.9),
        busy_threshold=section.number("busy_threshold", default.busy_threshold, 0.1, 1),
        retry_seconds=section.number("retry_seconds", default.retry_seconds, 1, 3600),
    )
    section.finish()
    if result.busy_threshold - result.idle_threshold < 0.1:
        raise ConfigError(
            section.key_path("busy_threshold"),
            "must exceed idle_threshold by at least 0.1 (the gap absorbs utilization noise)",
        )
    if result.sample_interval_seconds * 2 > result.window_seconds:
        raise ConfigError(
            section.key_path("sample_interval_seconds"), "must be at most half of window_seconds"
        )
    return result


def _training(section: Section) -> TrainingConfig:
    default = TrainingConfig()
    result = TrainingConfig(
        enabled=section.boolean("enabled", True),
        socket=section.optional_path("socket", str(default.socket)),
        token_file=section.optional_path("token_file"),
        ttl_seconds=section.number("ttl_seconds", default.ttl_seconds, 1, 86400),
        max_jobs=section.integer("max_jobs", default.max_jobs, 1, 100_000),
        max_ranks_per_job=section.integer(
            "max_ranks_per_job", default.max_ranks_per_job, 1, 1_000_000
        ),
        socket_mode=section.parsed("socket_mode", f"{default.socket_mode:04o}", _file_mode),
        receive_buffer_bytes=section.integer(
            "receive_buffer_bytes", default.receive_buffer_bytes, 4096, 1 << 30
        ),
        window_seconds=section.number("window_seconds", default.window_seconds, 1, 3600),
        max_label_length=section.integer("max_label_length", default.max_label_length, 8, 1024),
    )
    section.finish()
    return result


def _file_mode(text: str) -> int:
    """An octal permission string such as ``"0660"`` (quoted: YAML reads 0660 as a number)."""
    if not re.fullmatch(r"0?[0-7]{3}", text):
        raise ValueError(f"expected octal permission bits such as \"0660\", got {text!r}")
    return int(text, 8)


def _tencent(section: Section) -> TencentConfig:
    from exporter.tencent.catalogue import select

    default = TencentConfig()
    result = TencentConfig(
        enabled=section.boolean("enabled", False),
        endpoint=_url(section, "endpoint", default.endpoint),
        region=section.optional_string("region"),
        regions=section.string_list("regions"),
        secret_id=section.optional_string("secret_id"),
        secret_key=_secret_reference(section, "secret_key"),
        secret_key_file=section.optional_path("secret_key_file"),
        session_token=_secret_reference(section, "session_token"),
        role=section.optional_string("role"),
        metadata_url=_url(section, "metadata_url", default.metadata_url),
        instances=section.string_list("instances"),
        disks=section.string_list_map("disks"),
        discovery_tags=section.string_map("discovery_tags"),
        discover_disks=section.boolean("discover_disks", default.discover_disks),
        discovery_interval_seconds=section.number(
            "discovery_interval_seconds", default.discovery_interval_seconds, 10, 86400
        ),
        metrics=section.string_list("metrics"),
        period_seconds=section.integer("period_seconds", default.period_seconds, 1, 86400),
        delay_seconds=section.integer("delay_seconds", default.delay_seconds, 0, 86400),
        window_periods=section.integer("window_periods", default.window_periods, 1, 60),
        batch_size=section.integer("batch_size", default.batch_size, 1, 50),
        rate_limit=section.number("rate_limit", default.rate_limit, 0.1, 20),
        concurrency=section.integer("concurrency", default.concurrency, 1, 32),
        request_timeout_seconds=section.number(
            "request_timeout_seconds", default.request_timeout_seconds, 0.1, 120
        ),
        max_retries=section.integer("max_retries", default.max_retries, 0, 10),
    )
    section.finish()
    try:
        select(result.metrics)
    except ValueError as error:
        raise ConfigError(section.key_path("metrics"), str(error)) from None
    if result.enabled:
        _check_tencent(section, result)
    return result


def _check_tencent(section: Section, config: TencentConfig) -> None:
    """Rules between keys of an enabled tencent section (a disabled one may be partial)."""
    checks = [
        ("secret_key_file", config.secret_key and config.secret_key_file,
         "set secret_key or secret_key_file, not both"),
        ("secret_id", config.secret_id and not (config.secret_key or config.secret_key_file),
         "secret_id needs secret_key or secret_key_file"),
        ("secret_key", (config.secret_key or config.secret_key_file) and not config.secret_id,
         "secret_key needs secret_id"),
        ("regions", config.region and config.regions, "set region or regions, not both"),
        ("instances", config.instances and len(config.regions) > 1,
         "static instances need a single region; use discovery_tags for several regions"),
        ("disks", config.disks and not config.instances,
         "disks needs instances (with discovery, disks are discovered too)"),
        ("discovery_tags", config.discovery_tags and config.instances,
         "discovery_tags has no effect when instances are listed"),
    ]
    for key, failed, message in checks:
        if failed:
            raise ConfigError(section.key_path(key), message)


def _secret_reference(section: Section, key: str) -> str | None:
    """A secret, accepted only as a ``${VAR}`` reference so it never sits in the file."""
    raw = section.raw(key)
    if raw is None:
        return None
    if not isinstance(raw, str) or not re.fullmatch(r"\$\{[A-Za-z_][A-Za-z0-9_]*\}", raw):
        raise ConfigError(
            section.key_path(key),
            "must be a ${VAR} reference to an environment variable (or use a *_file key); "
            "secrets are not written into configuration files",
        )
    return section.optional_string(key)


def _url(section: Section, key: str, default: str) -> str:
    value = section.string(key, default)
    if not re.fullmatch(r"https?://[^/\s]+/?", value):
        raise ConfigError(section.key_path(key), f"expected http(s)://host[:port], got {value!r}")
    return value.rstrip("/")
