"""``trainmon top``: a live terminal view of a node's jobs and ranks.

Above ``doctor`` and the report: each second a snapshot of the same samples
``doctor`` reads goes through the same engine, and the screen shows what it
found, per job and rank. The parts, one concern each:

- ``source``: where the snapshots come from (a daemon's ``/metrics``, checked
  as ``doctor`` checks it; one node's series through Prometheus' ``/federate``);
- ``model``: the window of snapshots and its report as rows (``TopView``): per
  rank step time, samples/s, data wait, exposed communication (per group),
  GPU utilization, SM activity and memory, and what was found (``Mark``);
- ``render``: a view and the keys' state as lines of styled text for a width
  and height, in English or Chinese: pure, so the tests read it as text;
- ``keys``: what each key does to that state;
- ``profiles``: ``p``'s on-demand profile of the job shown, asked and followed on a
  thread, and the line it shows;
- ``screen``: the reading thread and the curses loop (the only ``curses`` import);
- ``command``: ``run_top``, which the CLI calls.
"""
