"""The node's kernel files: network interfaces, block devices, RDMA ports.

- ``netdev``: ``/proc/net/dev`` counters and ``/sys/class/net/<device>/speed``;
- ``diskstats``: ``/proc/diskstats`` of whole disks (told apart from
  partitions by sysfs), in bytes and seconds;
- ``infiniband``: ``/sys/class/infiniband`` port counters, rate, state and
  link layer;
- ``kernelfiles``: reading one small procfs/sysfs file, and keeping 32-bit
  counters monotonic across wraps.

Each reader returns typed readings; ``trainmon.collectors`` turns them into
metric families, and ``trainmon.diagnosis.nccl`` reads the interfaces and
ports too.
"""
