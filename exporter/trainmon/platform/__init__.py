"""The node's platform: which cloud instance (or self-hosted machine) it is, and spot reclaim.

- ``config``: the ``collectors.platform`` section and its label validation;
- ``dmi``: the firmware's vendor strings (``/sys/class/dmi/id``): provider
  detection without network;
- ``poller``: the background thread, the provider decision and the rules for
  what a failed poll keeps; it reads the Tencent Cloud CVM metadata service
  through ``trainmon.tencent.metadata`` (every value checked against a strict
  pattern; documented paths and the URLs of their docs there).

``trainmon.collectors.platform`` turns the poller's state into
``trainmon_node_info``, ``trainmon_node_spot_*`` and ``trainmon_platform_metadata_*``.
"""
