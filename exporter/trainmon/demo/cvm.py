"""A simulated Tencent Cloud spot GPU instance (a CVM) behind the metadata transport, for
``--demo``.

``SimulatedMetadata`` answers like the CVM metadata service does (text values,
404 for what does not exist) at the ``MetadataTransport`` boundary, so the
real validation, poller and collector run on it unchanged: a spot
(``SPOTPAID``) ``GT4.41XLARGE948`` in ``ap-shanghai-5`` with no reclaim
scheduled. The instance id ``ins-demo0001`` is not a real one.

``PLACEMENT_LABELS`` is where the instance hangs in the cluster network, which no
metadata service tells: the demo's ``collectors.platform.labels`` unless the
configuration sets some, so that ``trainmon_node_info`` carries a ``leaf`` and a
``rack`` and the placement rules and panels (zones and leaf switches per job)
have something to count.
"""

from __future__ import annotations

from collections.abc import Mapping

from trainmon.tencent.metadata import MetadataReply

INSTANCE: Mapping[str, str] = {
    "instance-id": "ins-demo0001",
    "placement/region": "ap-shanghai",
    "placement/zone": "ap-shanghai-5",
    "instance/instance-type": "GT4.41XLARGE948",
    "payment/charge-type": "SPOTPAID",
}
#: Leaf switch and rack of the simulated instance (``trainmon_node_info`` labels).
PLACEMENT_LABELS: Mapping[str, str] = {"leaf": "leaf-07", "rack": "r12"}


class SimulatedMetadata:
    """The metadata service of the demo's instance (no reclaim: ``spot/termination-time`` 404)."""

    def __init__(self, values: Mapping[str, str] = INSTANCE) -> None:
        self._values = dict(values)

    def get(self, path: str) -> MetadataReply:
        value = self._values.get(path)
        if value is None:
            return MetadataReply(404, b"404 - Not Found", "text/html")
        return MetadataReply(200, value.encode(), "text/plain")
