"""Reading procfs/sysfs files, and keeping wrapping kernel counters monotonic.

Shared by the node readers (``netdev``, ``infiniband``, ``diskstats``) and
``trainmon.diagnosis.nccl``. Two concerns that the node readers meet:

- **Reading one small kernel file.** A missing attribute file is normal (a virtual NIC
  has no ``speed``, an old HCA has no ``counters_ext``) and gives ``None``
  silently. A file that exists but cannot be read — permission denied, or the
  ``EINVAL`` some drivers return from ``read()`` for attributes they do not
  support — also gives ``None``, and is logged at debug level once per path,
  so a scrape every 15 s does not repeat the same line forever. A *required*
  table (``/proc/net/dev``, ``/proc/diskstats``) that is missing makes the
  collector unavailable instead (``required_text``).
  Every read goes through ``trainmon.core.files.read_file`` (four system
  calls for a small file, not nine).
- **32-bit counter wrap.** Some kernels and drivers expose 32-bit counters
  (``/proc/diskstats`` on 32-bit kernels and its millisecond fields on older
  64-bit ones, the statistics of some NIC drivers). ``CounterWrapTracker``
  remembers the previous raw value of each series and adds 2**32 when a value
  below 2**32 goes backwards, so the exported Prometheus counter stays
  monotonic.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Mapping
from pathlib import Path
from typing import Generic, TypeVar

from trainmon.core.collector import CollectorUnavailable
from trainmon.core.files import decode_text, read_file
from trainmon.logthrottle import LogThrottle

#: A 32-bit counter wraps from 2**32 - 1 to 0.
#: Which devices (interfaces, disks) a reader keeps, by name: the configured include/exclude.
DeviceFilter = Callable[[str], bool]


def any_device(name: str) -> bool:
    """The default ``DeviceFilter``: keep everything."""
    return True


WRAP_MODULUS = 1 << 32

K = TypeVar("K", bound=Hashable)


class KernelFileReader:
    """Reads small procfs/sysfs attribute files for one reader.

    ``logger`` is the reader's module logger, so that the debug lines name
    the source. At most ``max_remembered`` unreadable paths are remembered
    (the set is cleared when full, so memory stays bounded on hosts whose
    devices come and go).
    """

    def __init__(self, logger: logging.Logger, max_remembered: int = 4096) -> None:
        self._log = logger
        self._reported = LogThrottle(None, max_keys=max_remembered)  # once per path

    def text(self, path: Path) -> str | None:
        """The stripped ASCII content of ``path``; ``None`` if missing or unreadable."""
        try:
            data = read_file(path)
        except FileNotFoundError:
            return None
        except OSError as error:
            self._report_once(path, f"cannot read: {error.strerror or error}")
            return None
        return data.decode("ascii", errors="replace").strip()

    @staticmethod
    def required_text(path: Path) -> str:
        """The whole ASCII content of ``path`` (undecodable bytes replaced).

        Raises ``CollectorUnavailable`` when the file does not exist; other
        ``OSError``s propagate (the registry reports the collector as failed).
        """
        try:
            return decode_text(read_file(path))
        except FileNotFoundError:
            raise CollectorUnavailable(f"{path} does not exist") from None

    def integer(self, path: Path) -> int | None:
        """The decimal integer in ``path``; ``None`` if missing, unreadable or not an integer."""
        text = self.text(path)
        if text is None:
            return None
        try:
            return int(text)
        except ValueError:
            self._report_once(path, f"not an integer: {text[:40]!r}")
            return None

    def _report_once(self, path: Path, message: str) -> None:
        if self._reported.allow(path):
            self._log.debug("%s: %s; the sample is omitted", path, message)


class CounterWrapTracker(Generic[K]):
    """Turns raw kernel counters into monotonic values across 32-bit wraps.

    Per series (any hashable key, e.g. ``("receive_bytes", "eth0")``) it keeps
    the previous raw value and an offset. When a raw value goes backwards:

    - from a previous value below 2**32, the counter is taken to have wrapped
      and 2**32 is added to the offset;
    - from a previous value at or above 2**32 (a 64-bit counter), it is a real
      reset (device re-created, driver reloaded): the offset is dropped and the
      raw value exported, which Prometheus treats as a counter reset.

    Limits: two wraps between two reads look like one; a real reset of a
    counter that was still below 2**32 looks like a wrap. Counters that
    *saturate* instead of wrapping (InfiniBand's legacy 32-bit port counters)
    must not go through this class.

    The tracker is not thread-safe, and the caller must serialise "read the
    file, then ``extend``" so that snapshots arrive in the order they were taken.
    """

    def __init__(self) -> None:
        self._state: dict[K, tuple[int, int]] = {}  # key -> (previous raw, offset)

    def extend(self, raw: Mapping[K, int]) -> dict[K, int]:
        """The monotonic value of every series in ``raw``.

        ``raw`` must be the complete snapshot of one read: series absent from
        it are forgotten (their devices disappeared), which bounds the state.
        """
        state: dict[K, tuple[int, int]] = {}
        values: dict[K, int] = {}
        for key, value in raw.items():
            previous, offset = self._state.get(key, (value, 0))
            if value < previous:
                offset = offset + WRAP_MODULUS if previous < WRAP_MODULUS else 0
            state[key] = (value, offset)
            values[key] = value + offset
        self._state = state
        return values
