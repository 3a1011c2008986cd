"""What the firmware says about the machine: ``<sys>/class/dmi/id/sys_vendor`` and ``product_name``.

A Tencent Cloud CVM reports the system vendor ``Tencent Cloud`` (product
``CVM``), the same strings ``dmidecode -s system-manufacturer`` prints. Reading
two sysfs files costs nothing and needs no network, so provider detection
tries it first; the metadata service is only probed (in the background) when
DMI does not say Tencent. Missing files (containers without ``/sys/class/dmi``,
non-x86 hosts) are normal and mean "DMI cannot tell".
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from trainmon.node.kernelfiles import KernelFileReader

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DMIIdentity:
    """The two DMI strings; ``None`` where the file is missing or unreadable."""

    sys_vendor: str | None
    product_name: str | None

    @property
    def tencent(self) -> bool:
        """True when the firmware names Tencent Cloud as the vendor."""
        return self.sys_vendor is not None and "tencent" in self.sys_vendor.lower()


def read_dmi(sys_root: Path, reader: KernelFileReader | None = None) -> DMIIdentity:
    """The DMI vendor and product of the machine whose sysfs is at ``sys_root``."""
    reader = reader or KernelFileReader(log)
    directory = sys_root / "class" / "dmi" / "id"
    return DMIIdentity(
        sys_vendor=reader.text(directory / "sys_vendor") or None,
        product_name=reader.text(directory / "product_name") or None,
    )
