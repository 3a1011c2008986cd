"""Tencent Cloud: the Cloud Monitor puller behind ``trainmon.collectors.tencent``, and the
CVM metadata client that it and ``trainmon.platform`` share.

One concern per module:

* ``metadata`` — the CVM instance metadata service: the one HTTP client of it,
  and the validated identity and spot-reclaim reads of the platform poller;
* ``signer`` — TC3-HMAC-SHA256 request signatures;
* ``credentials`` — config → environment → CVM role chain, region lookup;
* ``ratelimit`` — the account-wide token bucket;
* ``client`` — signed API calls, error envelopes, retry policy, call stats;
* ``catalogue`` — which Cloud Monitor metrics become which trainmon metrics;
* ``targets`` — instances and disks from config or discovery, and their placements;
* ``planning`` — windows, periods, name matching, refresh interval;
* ``store`` — matching answers by dimensions, the latest value per series;
* ``pricing`` — the pay-as-you-go price per GPU-hour of the instance types in use;
* ``puller`` — ``TencentPuller``, the background refresh loop.
"""
