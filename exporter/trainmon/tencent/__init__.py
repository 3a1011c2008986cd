"""The Tencent Cloud Monitor puller behind ``trainmon.collectors.tencent``.

One concern per module:

* ``signer`` — TC3-HMAC-SHA256 request signatures;
* ``credentials`` — config → environment → CVM role chain, region lookup;
* ``ratelimit`` — the account-wide token bucket;
* ``client`` — signed API calls, error envelopes, retry policy, call stats;
* ``catalogue`` — which Cloud Monitor metrics become which trainmon metrics;
* ``targets`` — instances and disks from config or discovery;
* ``planning`` — windows, periods, name matching, refresh interval;
* ``store`` — matching answers by dimensions, the latest value per series;
* ``scheduler`` — the background refresh loop.
"""
