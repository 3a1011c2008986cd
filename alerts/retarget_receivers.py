#!/usr/bin/env python3
"""Copy an Alertmanager configuration with every receiver pointed at one base URL.

The shipped ``deploy/alertmanager/alertmanager.yml`` notifies real systems
(an on-call webhook, 企业微信/WeCom, a chat bridge). To try its routes,
grouping and inhibitions without paging anyone — in a staging Alertmanager or
in the end-to-end test — this writes a copy whose endpoints all lead to a
webhook sink you run::

    python alerts/retarget_receivers.py deploy/alertmanager/alertmanager.yml \\
        http://127.0.0.1:5001 /tmp/alertmanager.yml

Rewritten, and nothing else:

* ``url`` of every ``<kind>_configs`` entry → ``BASE/<receiver>/<kind>``
  (``/<n>`` appended when a receiver has several entries of one kind);
* ``api_url`` of every entry → ``BASE/<receiver>/<kind>/``; a ``wechat_configs``
  entry without one gets it too, so WeCom's ``gettoken`` and ``message/send``
  calls reach the sink instead of qyapi.weixin.qq.com;
* every global ``*_url`` → ``BASE/global/<key>/``;
* relative ``templates`` globs → absolute, so the copy can live anywhere.

Integrations without a URL (``email_configs``) are left alone and reported on
stderr. Only PyYAML and the standard library are needed.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

#: Integrations whose endpoint Alertmanager derives from a global *_api_url.
API_URL_KINDS = ("wechat", "slack", "opsgenie", "victorops", "telegram", "webex")


def retarget(config: dict[str, Any], base_url: str, config_dir: Path) -> list[str]:
    """Point every receiver of ``config`` (in place) at ``base_url``.

    Returns notes about integrations that could not be redirected.
    """
    base = base_url.rstrip("/")
    notes: list[str] = []
    global_section = config.get("global") or {}
    for key in list(global_section):
        if key.endswith("_url"):
            global_section[key] = f"{base}/global/{key}/"
    for receiver in config.get("receivers") or []:
        name = receiver["name"]
        for field, entries in receiver.items():
            if not field.endswith("_configs"):
                continue
            kind = field.removesuffix("_configs")
            for index, entry in enumerate(entries):
                suffix = f"/{index}" if len(entries) > 1 else ""
                endpoint = f"{base}/{name}/{kind}{suffix}"
                redirected = False
                if "url" in entry:
                    entry["url"] = endpoint
                    redirected = True
                if "api_url" in entry or kind in API_URL_KINDS:
                    entry["api_url"] = endpoint + "/"
                    redirected = True
                if not redirected:
                    notes.append(f"receiver {name}: {field}[{index}] has no URL; left unchanged")
    config["templates"] = [
        pattern if Path(pattern).is_absolute() else str(config_dir / pattern)
        for pattern in config.get("templates") or []
    ]
    return notes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", type=Path, help="the Alertmanager configuration to copy")
    parser.add_argument("base_url", help="where every receiver should send, e.g. http://127.0.0.1:5001")
    parser.add_argument("output", type=Path, help="the file to write")
    args = parser.parse_args(argv)
    config = yaml.safe_load(args.config.read_text(encoding="utf-8"))
    notes = retarget(config, args.base_url, args.config.resolve().parent)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    args.output.write_text(
        f"# {args.config} with every receiver pointed at {args.base_url}\n"
        "# (alerts/retarget_receivers.py); for tests and staging only.\n"
        + yaml.safe_dump(config, sort_keys=False, allow_unicode=True),
        encoding="utf-8",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
