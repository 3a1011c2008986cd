"""The secret rule: what of a client's text may be stored, exported or logged.

Standard library only and nothing else of trainmon: the training-side client
(``trainmon.client``) and the daemon (``trainmon.training.protocol``, which
re-exports these names) apply this one rule, the client before it sends and the
daemon again on receipt, whatever the client did. docs/security.md ("Redaction")
states it for users; ``tests/security/test_secret_corpus.py`` holds it to a
corpus of secret shapes, end to end.

Two parts:

- **By name** (``is_secret_name``): a config or framework key, or an environment
  name, containing ``TOKEN``, ``SECRET``, ``KEY``, ``PASSWORD``, ``PASSWD``,
  ``CREDENTIAL`` or ``AUTH`` (any case) has its whole value replaced
  (``redact_value``); so has a source line of a stall frame that contains one
  (``redact_code``).
- **By shape** (``redact_text``), in every string value whatever its key:

  * URL userinfo, up to the **last** ``@`` before the host
    (``https://bob:p@ss@host`` → ``https://<redacted>@host``), also after
    ``os.path.abspath`` folded the slashes (``/work/s3:/KEY:SECRET@bucket``), and
    ``user:password@host`` without a scheme;
  * ``name=value`` and ``name: value`` pairs (query strings, bare or in a URL;
    ``--name=value``; Hydra's ``+db.password=…``; JSON and YAML) and
    ``--name value`` flags whose name is secret-looking (``SECRET_NAME_PARTS``) or a
    signature parameter (``is_secret_parameter``): any name containing
    ``signature``, ``X-Amz-*``, ``X-Goog-*``, and ``sig``, ``sign``, ``pass``,
    ``pwd``. Azure SAS's ``se``, ``sp``, ``sv``, ``sr`` are kept: without ``sig``
    they grant nothing;
  * ``Authorization:`` header values and ``Bearer`` tokens;
  * well-known token shapes: OpenAI/Anthropic ``sk-…``, Stripe ``sk_live_…``,
    GitHub ``ghp_``/``gho_``/``ghs_``/``ghu_``/``ghr_``/``github_pat_``, GitLab
    ``glpat-``, Slack ``xox?-``/``xapp-``, JWTs, AWS access key ids
    (``AKIA``/``ASIA``… + 16), Tencent Cloud ``AKID…``, Google ``AIza…``, ``ya29.``,
    ``GOCSPX-``, Hugging Face ``hf_…``/``api_org_…``, npm, PyPI, Docker Hub,
    SendGrid, DigitalOcean, Databricks, Shopify, Vault, Replicate, Groq, xAI,
    Telegram bot tokens;
  * the secret path of webhook URLs (Slack, Discord, Teams, Zapier, and any
    ``https://host/…/webhook(s)/…`` or ``/hooks/…``);
  * PEM private keys, header to footer.

What is kept: the scheme, host, path and innocuous parameters of a URL, the
name of a redacted parameter or flag, the key of a redacted value. A secret is
replaced by ``REDACTED``; the rule is idempotent and never turns a redaction a
cut has shortened (``<redac…``) back into a longer one, so a value cut to its
limit after redaction stays within it when redacted again.

Cost: each family of shapes runs only on a text that holds what it needs, so a
text without ``@``, ``=``, ``:``, a space or 15 characters costs a few ``in``
tests; and it stays linear in the text, hostile texts included: each ``@`` and
each secret-looking word is looked at once, and no expression backtracks over
more than a few hundred characters (``bench/training_ingest.py --redaction``).
"""

from __future__ import annotations

import re

#: What a secret is replaced with, on the client and again in the daemon.
REDACTED = "<redacted>"
#: Name parts that mark a credential (case-insensitive substrings). Broad on
#: purpose: a false positive (``tokenizer``, ``max_tokens``, ``author``) costs
#: one value in a comparison; a false negative leaks a secret into a ledger,
#: a metric and a log.
SECRET_NAME_PARTS: tuple[str, ...] = (
    "TOKEN", "SECRET", "KEY", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH",
)
#: Parameter names (``name=value``, ``--name value``) redacted besides the secret-looking
#: ones: cloud signature parameters (S3/GCS presigned URLs, Azure SAS ``sig``, Tencent
#: COS ``sign``/``q-signature``, CloudFront/OSS ``Signature``) and short password names.
SIGNATURE_NAMES: tuple[str, ...] = ("sig", "sign", "pass", "pwd")
#: Prefixes of signed-request parameters, all of which are redacted.
SIGNATURE_PREFIXES: tuple[str, ...] = ("x-amz-", "x-goog-")

# Each family of shapes has its own precompiled expression, run only on a text that
# holds what its shapes need (``redact_text``); ``name=value`` pairs and flags are found
# from the secret-looking parts of their names (``_redact_parameters``). A text without
# ``@``, a secret-looking word or 15 characters (most config values, versions, paths)
# costs a few ``in`` tests.

#: PEM private keys, header to footer (or to the end, where a cut took the footer).
_PEM = re.compile(r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----(?s:.*?)"
                  r"(?:-----END[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|\Z)")
#: URL userinfo, found from its ``@`` (``_redact_userinfo``: the last ``@`` of a host's
#: segment) and read backwards, over the reversed text, in the order tried:
#:
#: 1. ``scheme://userinfo@`` (also ``scheme:/``, as ``os.path.abspath`` folds ``://``),
#:    the userinfo holding neither ``/``, ``?``, ``#`` nor whitespace (``@`` it may);
#: 2. ``scheme://user:password@`` whose password holds ``/`` (AWS secret keys do),
#:    unless what follows the ``:`` is a port (``host:8080/a@b``);
#: 3. ``user:password@`` without a scheme, at the start or after ``/ = , ;`` a space,
#:    a quote or ``(``.
#:
#: Each reads at most a few hundred characters back from one ``@``, and each ``@`` is
#: looked at once, so a hostile text costs time linear in its length.
_SCHEME_REVERSED = r"/{1,2}:[A-Za-z0-9+.-]*[A-Za-z](?![A-Za-z0-9+.-])"
_USERINFO_REVERSED: tuple[re.Pattern[str], ...] = (
    re.compile(r"@(?P<userinfo>[^/?#\s]{0,255}[^/?#\s@])" + _SCHEME_REVERSED),
    re.compile(r"@(?P<userinfo>(?P<password>[^?#\s@]{1,256}):[^/?#\s:@\[\]]{1,128})"
               + _SCHEME_REVERSED),
    re.compile(r"@(?P<userinfo>[^/?#\s]{0,256}:[^/@\s:=,;\"'(]{1,128})"
               r"(?=[/\s=,;\"'(]|\Z)"),
)
#: The rest of a host's segment after an ``@``: a further ``@`` in it is the last one.
_SEGMENT_REST = re.compile(r"[^/?#\s@]*")
#: A password that is a port and a path (``8080/a``), reversed: ``a/0808``.
_PORT_REVERSED = re.compile(r"(?s:.*)[/?#\s][0-9]+\Z")
#: A name of a pair or flag: read forwards from a secret-looking part of it, and
#: backwards over the reversed text (the same characters).
_NAME = re.compile(r"[\w.+~-]*")
#: What separates a pair's name from its value: ``=``, ``: `` (YAML, headers) or a
#: closing quote and ``:`` (JSON, Python reprs).
_PAIR_SEPARATOR = re.compile(r"\s*=\s*|[\"']\s*:\s*|:[ \t]+")
#: What separates a flag (a name starting with ``-``) from its value; a value starting
#: with ``-`` is the next flag.
_FLAG_SEPARATOR = re.compile(r"\s+(?!-)")
#: A value: quoted (to its closing quote, or the end where a cut took it), or a run of
#: characters up to whitespace, ``&`` (the next query parameter) or a quote.
_VALUE = re.compile(r"""(?P<quote>["'])(?P<quoted>[^"']*)|(?P<bare>[^\s&"']+)""")
#: An ``Authorization`` value: an optional quote and scheme word, which are kept.
_AUTHORIZATION_VALUE = re.compile(
    r"(?P<kept>[\"']?(?:(?i:bearer|basic|token|digest|negotiate|ntlm|apikey"
    r"|aws4-hmac-sha256)\s+)?)(?P<secret>[^\s\"'&]+)")
#: ``Bearer <token>`` anywhere.
_BEARER = re.compile(r"(?<![\w-])(?P<b>(?i:bearer)\s+)[A-Za-z0-9._~+/-]{8,}=*")
#: Webhook URLs: the path past the well-known prefix (``hooks.slack.com/services``…, or
#: ``…/webhook(s)/`` or ``…/hooks/`` of an http(s) URL) is the secret.
_HOOKS = re.compile(
    r"(?P<h>(?<![\w.-])(?i:hooks\.slack\.com/(?:services|workflows|triggers|actions)"
    r"|discord(?:app)?\.com/api/webhooks|[\w-]+\.webhook\.office\.com/webhookb2"
    r"|outlook\.office(?:365)?\.com/webhook|hooks\.zapier\.com/hooks/catch)"
    r"|(?:(?i:https?):/{1,2}|(?<=@))[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+(?::[0-9]+)?/"
    r"(?:[^\s?#\"'/]+/)*?(?i:webhooks?|hooks))/(?P<hv>[^\s?#\"'&]+)"
)
#: Well-known token shapes, whatever their key; the shortest is 15 characters.
_TOKENS = re.compile(
    r"(?=[0-9AGSadeghnprsxy])(?<![A-Za-z0-9])(?:"  # their first characters: a fast way out
    r"sk-(?=[A-Za-z_-]{0,64}[0-9])[A-Za-z0-9_-]{20,}"  # OpenAI, Anthropic (sk-ant-, sk-proj-)
    r"|[rs]k_(?:live|test)_[A-Za-z0-9]{16,}"  # Stripe
    r"|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,}"  # GitHub
    r"|glpat-[A-Za-z0-9_-]{20,}"  # GitLab
    r"|xox[abposre]-[A-Za-z0-9-]{10,}|xapp-[0-9]-[A-Za-z0-9-]{10,}"  # Slack
    r"|eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"  # JWT
    r"|(?:AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AROA|AIPA|ANPA|ANVA|A3T[A-Z0-9])[A-Z0-9]{16}"
    r"(?![A-Za-z0-9])"  # AWS access key ids
    r"|AKID[A-Za-z0-9]{13,40}"  # Tencent Cloud SecretId
    r"|AIza[A-Za-z0-9_-]{35}|ya29\.[A-Za-z0-9_-]{20,}|GOCSPX-[A-Za-z0-9_-]{20,}"  # Google
    r"|hf_[A-Za-z0-9]{30,}|api_org_[A-Za-z0-9]{30,}"  # Hugging Face
    r"|npm_[A-Za-z0-9]{36}|pypi-AgE[A-Za-z0-9_-]{40,}|dckr_pat_[A-Za-z0-9_-]{20,}"
    r"|SG\.[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}"  # SendGrid
    r"|do[por]_v1_[a-f0-9]{64}|dapi[a-f0-9]{32}|shp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}"
    r"|hvs\.[A-Za-z0-9_-]{20,}|r8_[A-Za-z0-9]{30,}|gsk_[A-Za-z0-9]{40,}"
    r"|xai-[A-Za-z0-9]{40,}"
    r"|[0-9]{8,10}:AA[A-Za-z0-9_-]{30,}"  # Telegram bot tokens ...
    r")|(?<=bot)[0-9]{8,10}:AA[A-Za-z0-9_-]{30,}"  # ... also in api.telegram.org/bot<token>
)
_SHORTEST_TOKEN = 15
#: What every secret parameter name holds one of (``is_secret_parameter``).
_PARAMETER_PARTS: tuple[str, ...] = (
    "token", "secret", "key", "pass", "credential", "auth", "sig", "pwd", *SIGNATURE_PREFIXES)


def is_secret_name(name: str) -> bool:
    """Whether a config key or environment name looks like a credential.

    Case-insensitive substrings ``SECRET_NAME_PARTS`` (``HF_TOKEN``,
    ``aws_secret_access_key``, ``db.password``, ``NCCL_IB_AUTH``…); a dotted
    key of a nested mapping matches when any of its parts does.
    """
    upper = name.upper()
    return any(part in upper for part in SECRET_NAME_PARTS)


def is_secret_parameter(name: str) -> bool:
    """Whether the value of a ``name=value`` pair or a ``--name value`` flag is redacted:
    a secret-looking name (``is_secret_name``), a signature parameter (a name containing
    ``signature``, ``X-Amz-*``, ``X-Goog-*``) or one of ``SIGNATURE_NAMES``; leading
    ``-``, ``+`` and ``~`` (flags, Hydra overrides) do not count."""
    if is_secret_name(name):
        return True
    lower = name.lstrip("-+~").lower()
    return ("signature" in lower or lower.startswith(SIGNATURE_PREFIXES)
            or lower in SIGNATURE_NAMES)


def redact_value(name: str, value: str | int | float | bool | None,
                 ) -> str | int | float | bool | None:
    """``value`` as it may be sent and stored: ``REDACTED`` under a secret name,
    strings through ``redact_text``, other values unchanged."""
    if is_secret_name(name):
        return REDACTED
    if isinstance(value, str):
        return redact_text(value)
    return value


def redact_text(value: str) -> str:
    """``value`` with every secret of the rule (module docstring) replaced by
    ``REDACTED``; a text without one is returned unchanged."""
    if len(value) < _SHORTEST_TOKEN and not (
            "@" in value or "=" in value or ":" in value or " " in value):
        return value  # too short for a token, and neither userinfo, a pair nor a flag
    if "PRIVATE KEY" in value:
        value = _PEM.sub(REDACTED, value)
    if "@" in value:
        value = _redact_userinfo(value)
    if "=" in value or ":" in value or ("-" in value and (" " in value or "\t" in value)):
        value = _redact_parameters(value)
    if "earer" in value or "EARER" in value:
        value = _BEARER.sub(_replace_bearer, value)
    if "ook" in value or "OOK" in value:
        value = _HOOKS.sub(_replace_hook, value)
    if len(value) >= _SHORTEST_TOKEN and _TOKENS.search(value):
        value = _TOKENS.sub(REDACTED, value)
    return value


def redact_code(line: str) -> str:
    """A source line of a stall frame: ``REDACTED`` whole where it names a secret
    (``is_secret_name``: ``api_key = "…"``), else through ``redact_text``."""
    return REDACTED if is_secret_name(line) else redact_text(line)


def _redact_parameters(value: str) -> str:
    """``value`` with the values of its secret pairs and flags (``is_secret_parameter``)
    redacted: each is found from a secret-looking part of its name (``_PARAMETER_PARTS``),
    its name read both ways from there, then its separator and value."""
    lower = value.lower() if value.isascii() else "".join(
        char.lower() if char.isascii() else "?" for char in value)  # same indices
    if not ("key" in lower or "token" in lower or "pass" in lower or "secret" in lower
            or "auth" in lower or "sig" in lower or "credential" in lower or "pwd" in lower
            or "x-amz-" in lower or "x-goog-" in lower):  # _PARAMETER_PARTS, unrolled
        return value
    starts = sorted(index for part in _PARAMETER_PARTS if part in lower
                    for index in _finds(lower, part))
    reversed_value = value[::-1]
    size = len(value)
    pieces: list[str] = []
    done = 0  # value[:done] is in pieces already
    examined = 0  # the end of the last name looked at
    for index in starts:
        if index < done or index < examined:
            continue  # inside a value redacted already, or a name looked at
        begin = size - _name_end(reversed_value, size - index)
        end = examined = _name_end(value, index)
        name = value[begin:end]
        if begin < done or not is_secret_parameter(name):
            continue
        separator = _PAIR_SEPARATOR.match(value, end)
        if separator is None and name.startswith("-"):
            separator = _FLAG_SEPARATOR.match(value, end)
        if separator is None:
            continue
        kept, secret = _secret_span(value, separator.end(), separator.group(),
                                    name.lstrip("-+~").lower().endswith("authorization"))
        if secret is None:
            continue
        pieces += [value[done:kept], _redacted(value[kept:secret])]
        done = secret
    return "".join(pieces) + value[done:] if pieces else value


def _name_end(text: str, start: int) -> int:
    """Where the run of name characters (``_NAME``) from ``start`` ends."""
    return _name_end_of(_NAME, text, start)


def _finds(text: str, part: str) -> list[int]:
    """Every index of ``part`` in ``text``."""
    found: list[int] = []
    index = text.find(part)
    while index >= 0:
        found.append(index)
        index = text.find(part, index + 1)
    return found


def _secret_span(value: str, start: int, separator: str, authorization: bool,
                 ) -> tuple[int, int | None]:
    """(where the secret starts, where it ends) of the value at ``start``; (start, None)
    without one. An ``Authorization`` value keeps its quote and scheme word."""
    if authorization and separator.strip() in ("=", ":"):
        header = _AUTHORIZATION_VALUE.match(value, start)
        if header is None:
            return start, None
        return header.end("kept"), header.end()
    found = _VALUE.match(value, start)
    if found is None:
        return start, None
    if found.group("quote") is None:
        return start, found.end()
    if not found.group("quoted"):
        return start, None
    return found.start("quoted"), found.end("quoted")


def _redacted(value: str) -> str:
    """``REDACTED`` for a secret. A redaction already there (``<redacted>``, or one a
    cut shortened: ``<redac…``, ``…``) stays as it is, and a cut value shorter than
    ``REDACTED`` becomes a redaction cut to its length (``B…`` → ``<…``): redacting
    twice changes nothing, and never lengthens a value cut to its limit."""
    if value == REDACTED:
        return value
    if value.endswith("…") and len(value) < len(REDACTED):
        return REDACTED[:len(value) - 1] + "…"
    return REDACTED


def _redact_userinfo(value: str) -> str:
    """``value`` with the userinfo of its URLs (and of ``user:password@host``) redacted
    (``_USERINFO_REVERSED``)."""
    size = len(value)
    reversed_value = value[::-1]
    spans: list[tuple[int, int]] = []
    index = value.find("@")
    while index >= 0:
        after = _name_end_of(_SEGMENT_REST, value, index + 1)
        if after < size and value[after] == "@":
            index = after  # the host's segment goes on to a later "@": that one counts
            continue
        start = _userinfo_start(reversed_value, size - 1 - index)
        if start is not None and (not spans or start >= spans[-1][1]):
            spans.append((start, index))
        index = value.find("@", after)
    if not spans:
        return value
    pieces: list[str] = []
    done = 0
    for start, end in spans:
        pieces += [value[done:start], _redacted(value[start:end])]
        done = end
    return "".join(pieces) + value[done:]


def _userinfo_start(reversed_value: str, at: int) -> int | None:
    """Where the userinfo that ends at the ``@`` at ``at`` of ``reversed_value``
    starts, in the text the right way round; None where it is none."""
    size = len(reversed_value)
    for pattern in _USERINFO_REVERSED:
        found = pattern.match(reversed_value, at)
        if found is None:
            continue
        password = found.groupdict().get("password")
        if password is not None and _PORT_REVERSED.match(password):
            continue  # scheme://host:8080/a@b: a port and a path, not a password
        return size - found.end("userinfo")
    return None


def _name_end_of(pattern: re.Pattern[str], text: str, start: int) -> int:
    """Where the run of ``pattern`` (which matches the empty string) from ``start`` ends."""
    found = pattern.match(text, start)
    return start if found is None else found.end()


def _replace_bearer(match: re.Match[str]) -> str:
    return match.group("b") + REDACTED


def _replace_hook(match: re.Match[str]) -> str:
    return match.group("h") + "/" + _redacted(match.group("hv"))
