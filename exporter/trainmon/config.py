"""The configuration file: YAML → frozen objects, validated before anything binds.

``load_config(path)`` and ``parse_config(mapping)`` return a ``Config``; a
missing file (``path=None``) gives the built-in defaults, which start a useful
node daemon on any Linux machine. Errors are ``ConfigError`` with the key path.
The keys are documented in the README's configuration reference. The
sections of larger subsystems live beside them and are assembled here:
``trainmon.tencent.config``, ``trainmon.attribution.config``,
``trainmon.diagnosis.config``, ``trainmon.ledger.config``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from trainmon import contract
from trainmon.attribution.config import AttributionConfig, parse_attribution
from trainmon.diagnosis.config import DiagnosisConfig, parse_diagnosis
from trainmon.ledger.config import LedgerConfig, parse_ledger
from trainmon.paths import default_socket_path
from trainmon.platform.config import PlatformConfig, parse_platform
from trainmon.settings import Auto, ConfigError, Section
from trainmon.tencent.config import TencentConfig, parse_tencent

__all__ = [
    "AttributionConfig",
    "CollectorsConfig",
    "Config",
    "ConfigError",
    "DiagnosisConfig",
    "GPUConfig",
    "HTTPConfig",
    "ListenAddress",
    "PathsConfig",
    "TencentConfig",
    "TrainingConfig",
    "load_config",
    "parse_config",
    "parse_listen_address",
]

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
    """Limits that keep a slow or hostile client from stalling scrapes.

    Connections are counted while open; timeouts are deadlines (seconds), not
    per-read timeouts. ``trainmon.http.server`` documents the connection model.
    """

    #: Connections open at once, all clients together; more get an immediate 503.
    max_connections: int = 64
    #: Connections open at once from one client IP address; more get an immediate 503.
    #: A quarter of ``max_connections``: it takes four addresses to fill the server,
    #: and one Prometheus (one connection per target) plus the HTTP pushes of a
    #: node's ranks (one short connection per report) stay far below it.
    max_connections_per_client: int = 16
    #: Deadline for the request line and headers (and a TLS handshake), counted from
    #: when the server starts waiting for the request: accept, or the previous
    #: response on a keep-alive connection, whose idle wait it thus bounds too.
    header_timeout_seconds: float = 5.0
    #: Deadline for the whole request, body included, from the same moment.
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
    idle_threshold: float = contract.SAMPLER_IDLE_LEVEL
    #: A sample at or above this busy ratio puts the GPU in the busy state.
    busy_threshold: float = contract.SAMPLER_BUSY_LEVEL
    #: Seconds between attempts to (re)open NVML or to probe a lost GPU.
    retry_seconds: float = 10.0
    #: Read SM, tensor-core and DRAM activity through NVML GPM where the GPU has it.
    gpm: bool = True
    #: Seconds between two GPM samples (>= 0.1; 0 turns GPM off like ``gpm: false``).
    gpm_interval_seconds: float = 1.0

    @property
    def gpm_enabled(self) -> bool:
        return self.gpm and self.gpm_interval_seconds > 0


@dataclass(frozen=True)
class TrainingConfig:
    enabled: bool = True
    #: None: HTTP only. Default ``/run/trainmon/steps.sock`` for root (and the
    #: service user owning ``/run/trainmon``), else under ``$XDG_RUNTIME_DIR``
    #: (``trainmon.paths``).
    socket: Path | None = field(default_factory=default_socket_path)
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
    #: Jobs one writer may hold at once (its oldest makes room for its next).
    max_jobs_per_writer: int = 16
    #: Writers (``uid:N``, ``token:NAME``) that may report for any job, beside
    #: root and the daemon itself (docs/security.md).
    trusted_writers: tuple[str, ...] = ()
    #: Loopback HTTP clients without a token, identified by the kernel as their
    #: local user: ``auto`` allows them while no token_file is set.
    loopback_without_token: bool | Auto = "auto"


@dataclass(frozen=True)
class NumaConfig:
    """NUMA locality of GPU processes (``trainmon.collectors.numa``)."""

    enabled: bool = True


@dataclass(frozen=True)
class NFSConfig:
    """NFS/CFS client statistics from mountstats (``trainmon.collectors.nfs``)."""

    enabled: bool = True
    #: Include/exclude regexes over mount points (``/mnt/cfs``).
    mountpoints: DeviceFilter = DeviceFilter()


@dataclass(frozen=True)
class CollectorsConfig:
    gpu: GPUConfig = GPUConfig()
    network: NetworkConfig = NetworkConfig()
    infiniband: InfinibandConfig = InfinibandConfig()
    disk: DiskConfig = DiskConfig()
    training: TrainingConfig = field(default_factory=TrainingConfig)  # the socket: per user
    tencent: TencentConfig = field(default_factory=TencentConfig)
    attribution: AttributionConfig = field(default_factory=AttributionConfig)
    diagnosis: DiagnosisConfig = field(default_factory=DiagnosisConfig)
    numa: NumaConfig = NumaConfig()
    nfs: NFSConfig = NFSConfig()
    platform: PlatformConfig = field(default_factory=PlatformConfig)
    ledger: LedgerConfig = field(default_factory=LedgerConfig)


@dataclass(frozen=True)
class Config:
    listen: ListenAddress = ListenAddress("0.0.0.0", 19400)
    web_config_file: Path | None = None
    http: HTTPConfig = HTTPConfig()
    paths: PathsConfig = PathsConfig()
    collectors: CollectorsConfig = field(default_factory=CollectorsConfig)


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
        max_connections_per_client=section.integer(
            "max_connections_per_client", default.max_connections_per_client, 1, 100_000
        ),
        header_timeout_seconds=section.number(
            "header_timeout_seconds", default.header_timeout_seconds, 0.1, 3600
        ),
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
        tencent=parse_tencent(section.section("tencent")),
        attribution=parse_attribution(section.section("attribution")),
        diagnosis=parse_diagnosis(section.section("diagnosis")),
        numa=_numa(section.section("numa")),
        nfs=_nfs(section.section("nfs")),
        platform=parse_platform(section.section("platform")),
        ledger=parse_ledger(section.section("ledger")),
    )
    section.finish()
    return result


def _numa(section: Section) -> NumaConfig:
    result = NumaConfig(enabled=section.boolean("enabled", True))
    section.finish()
    return result


def _nfs(section: Section) -> NFSConfig:
    result = NFSConfig(
        enabled=section.boolean("enabled", True), mountpoints=_device_filter(section, None)
    )
    section.finish()
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
        gpm=section.boolean("gpm", default.gpm),
        gpm_interval_seconds=section.number(
            "gpm_interval_seconds", default.gpm_interval_seconds, 0, 60
        ),
    )
    section.finish()
    if 0 < result.gpm_interval_seconds < 0.1:
        raise ConfigError(
            section.key_path("gpm_interval_seconds"),
            "must be 0 (GPM off) or at least 0.1 (GPM metrics need 100 ms between samples)",
        )
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
        max_jobs_per_writer=section.integer(
            "max_jobs_per_writer", default.max_jobs_per_writer, 1, 100_000
        ),
        trusted_writers=section.string_list("trusted_writers"),
        loopback_without_token=section.enabled(
            "loopback_without_token", default.loopback_without_token
        ),
    )
    section.finish()
    for writer in result.trusted_writers:
        if not _WRITER.fullmatch(writer):
            raise ConfigError(
                section.key_path("trusted_writers"),
                f"expected uid:<number> or token:<name>, got {writer!r}",
            )
    return result


#: A writer identity in ``trusted_writers`` (``trainmon.training.writers``).
_WRITER = re.compile(r"uid:[0-9]{1,10}|token:[A-Za-z0-9_.-]{1,64}")


def _file_mode(text: str) -> int:
    """An octal permission string such as ``"0660"`` (quoted: YAML reads 0660 as a number)."""
    if not re.fullmatch(r"0?[0-7]{3}", text):
        raise ValueError(f"expected octal permission bits such as \"0660\", got {text!r}")
    return int(text, 8)
