"""The secret rule (``trainmon.training.redaction``) held to a corpus of secret shapes.

``CORPUS`` holds more than 30 shapes of secrets as they turn up in what a training
process sends: URL credentials (a password holding ``@`` or ``/``, folded by
``abspath``), query parameters (``access_token``, S3/GCS presigned, Azure SAS,
CloudFront, Tencent COS), webhook paths, ``--password=`` and ``--token value`` in a
command line, Hydra overrides, headers and JSON, and well-known token shapes
under innocuous keys (OpenAI, Anthropic, GitHub, GitLab, Slack, JWT, AWS, Google,
Hugging Face, Tencent Cloud, Stripe, npm, PyPI, SendGrid, Databricks,
DigitalOcean, Vault, Telegram, a PEM private key). Every secret is fake.

- The rule itself, shape by shape: the secret part is gone, the innocuous parts
  (host, path, other parameters, the parameter's name) are kept, redacting twice
  changes nothing, a value cut to its limit after redaction stays within it when
  redacted again (the client redacts, cuts, then redacts the description again),
  and the label sanitizer still maps the result onto the label charset.
- End to end: a real daemon receives run descriptions (config and framework
  values under innocuous keys, environment values, data paths, versions) and
  stall lines (frame files, as a presigned-URL loader sets ``co_filename``, frame
  functions, source lines) carrying every secret of the corpus, and none of them
  is in ``/metrics``, the ledger file (its rows through sqlite3, and its bytes),
  ``GET /api/v1/runs``, the daemon's log, ``trainmon runs`` or ``trainmon doctor``.
  The innocuous parts of each shape reach ``/metrics`` (the ``frame`` label).
"""

from __future__ import annotations

import json
import os
import re
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FunctionType

import pytest
import yaml

from testkit.daemon import Daemon, trainmon_command
from testkit.prometheus import wait_until
from trainmon.client import watchdog
from trainmon.contract import STEP_BUCKET_COUNT
from trainmon.training.protocol import (
    MAX_DESCRIPTION_VALUE_LENGTH,
    MAX_FRAME_CODE_LENGTH,
    MAX_FRAME_FILE_LENGTH,
    MAX_FRAME_FUNCTION_LENGTH,
    MAX_VERSION_LENGTH,
    REDACTED,
    RunDescription,
    StallReport,
    job_name,
    parse,
    sanitize_label,
)
from trainmon.training.redaction import redact_code, redact_text
from trainmon.training.report_fields import LABEL_PATTERN


@dataclass(frozen=True)
class Shape:
    """One secret shape: a text as a training process may send it, the parts of it
    that must not come out, and the parts that must."""

    name: str
    text: str
    secrets: tuple[str, ...]
    kept: tuple[str, ...] = ()


CORPUS: tuple[Shape, ...] = (
    # URL credentials
    Shape("password_with_at", "https://bob:p@ssw0rd-Qv7x@data.example.com/train",
          ("ssw0rd-Qv7x", "p@ssw0rd"), ("https://", "data.example.com/train")),
    Shape("password_with_slash",
          "s3://AKIAQ6X69ZFO9SW27FUM:je7MtGbClwBF/2Zp9Utk/h3yCo8nvb@ckpt-bucket/run7",
          ("je7MtGbClwBF", "2Zp9Utk", "h3yCo8nvb", "AKIAQ6X69ZFO9SW27FUM"),
          ("s3://", "ckpt-bucket/run7")),
    Shape("userinfo_folded_by_abspath", "/work/s3:/trainer:Fold3d-Pw-Zx81@bucket/imagenet",
          ("Fold3d-Pw-Zx81",), ("/work/s3:/", "bucket/imagenet")),
    Shape("userinfo_without_scheme", "mirror=deploy:Hunter2-Zq8x@pypi.internal:8443/simple",
          ("Hunter2-Zq8x",), ("mirror=", "pypi.internal:8443/simple")),
    Shape("database_url", "postgresql://trainer:Pg-Secret-4242@db.internal:5432/runs",
          ("Pg-Secret-4242",), ("postgresql://", "db.internal:5432/runs")),
    # query parameters
    Shape("access_token_parameter",
          "https://api.example.com/v1/data?access_token=Atk-9f8e7d6c5b4a3921&page=2",
          ("Atk-9f8e7d6c5b4a3921",), ("api.example.com/v1/data", "page=2", "access_token=")),
    Shape("s3_presigned",
          "https://ckpt.s3.amazonaws.com/model.pt?X-Amz-Credential=AKIAJQ7EXAMPLEKEY92%2F2024"
          "&X-Amz-Signature=5d41402abc4b2a76b9719d911017c592ffee",
          ("AKIAJQ7EXAMPLEKEY92", "5d41402abc4b2a76b9719d911017c592ffee"),
          ("ckpt.s3.amazonaws.com/model.pt", "X-Amz-Signature=")),
    Shape("s3_security_token",
          "https://ckpt.s3.amazonaws.com/shard-0001.tar?X-Amz-Security-Token="
          "IQoJb3JpZ2luX2VjFakeSessionToken0042&X-Amz-Expires=3600",
          ("IQoJb3JpZ2luX2VjFakeSessionToken0042",), ("ckpt.s3.amazonaws.com/shard-0001.tar",)),
    Shape("gcs_signed_url",
          "https://storage.googleapis.com/ds/train.bin?X-Goog-Signature=a1b2c3d4e5f60718293a4b"
          "&alt=media",
          ("a1b2c3d4e5f60718293a4b",), ("storage.googleapis.com/ds/train.bin", "alt=media")),
    Shape("azure_sas", "https://acct.blob.core.windows.net/data/train.bin?sv=2022-11-02&sp=r"
          "&se=2030-01-01&sig=Zm9vYmFyU2FzU2lnbmF0dXJl%3D",
          ("Zm9vYmFyU2FzU2lnbmF0dXJl",),
          ("acct.blob.core.windows.net/data/train.bin", "sp=r", "se=2030-01-01")),
    Shape("cloudfront_signed",
          "https://d111.cloudfront.net/img.tar?Expires=1700000000&Signature=Qm9ndXNTaWduYXR1cmU"
          "&Key-Pair-Id=K2JCJMDEHXQW5F",
          ("Qm9ndXNTaWduYXR1cmU", "K2JCJMDEHXQW5F"), ("d111.cloudfront.net/img.tar",)),
    Shape("tencent_cos_signed",
          "https://ckpt-1250000000.cos.ap-guangzhou.myqcloud.com/x.pt?q-ak="
          "AKIDAVuemil7VgEmMbfb4KJpHt6IxR2gdX5T&q-signature=28e9a4986df11bed0255e97ff9",
          ("AKIDAVuemil7VgEmMbfb4KJpHt6IxR2gdX5T", "28e9a4986df11bed0255e97ff9"),
          ("cos.ap-guangzhou.myqcloud.com/x.pt",)),
    Shape("bare_query_string", "region=eu-west-1&client_secret=Cl1ent-S3cret-7788&retries=3",
          ("Cl1ent-S3cret-7788",), ("region=eu-west-1", "retries=3")),
    # webhooks
    Shape("slack_webhook", "https://hooks.slack.com/services/T0FAKE123/B0FAKE456/XyZfakeHook42",
          ("XyZfakeHook42", "B0FAKE456"), ("hooks.slack.com/services/",)),
    Shape("discord_webhook",
          "https://discord.com/api/webhooks/112233445566778899/DiscordFakeHookTok_abcDEF12",
          ("DiscordFakeHookTok_abcDEF12", "112233445566778899"),
          ("discord.com/api/webhooks/",)),
    Shape("teams_webhook",
          "https://contoso.webhook.office.com/webhookb2/TeamsFakeSecret0099/IncomingWebhook/ab",
          ("TeamsFakeSecret0099",), ("contoso.webhook.office.com/webhookb2/",)),
    Shape("generic_webhook", "https://ci.example.org/api/webhooks/build/GenericHookSecret777",
          ("GenericHookSecret777",), ("ci.example.org/api/webhooks/",)),
    # command lines, overrides, headers, JSON
    Shape("flag_with_equals", "python train.py --password=Pa55-Flag-Eq7x --lr 3e-4",
          ("Pa55-Flag-Eq7x",), ("python train.py", "--password=", "--lr 3e-4")),
    Shape("flag_with_space", "torchrun train.py --hub-token HubTok-Space-8812 --epochs 3",
          ("HubTok-Space-8812",), ("torchrun train.py", "--hub-token", "--epochs 3")),
    Shape("hydra_override", "python train.py +db.password=Hydra-Pw-5521 trainer.max_epochs=10",
          ("Hydra-Pw-5521",), ("+db.password=", "trainer.max_epochs=10")),
    Shape("header_pair", "X-Api-Key: XApiKey-Hdr-3141; region=us",
          ("XApiKey-Hdr-3141",), ("X-Api-Key:",)),
    Shape("json_pair", '{"client_secret": "JsonClientSecret-2718", "region": "eu-west-1"}',
          ("JsonClientSecret-2718",), ('"client_secret": "', '"region": "eu-west-1"')),
    Shape("authorization_basic", "curl -H 'Authorization: Basic QmFzaWNGYWtlQ3JlZHM6eA==' ok",
          ("QmFzaWNGYWtlQ3JlZHM6eA",), ("Authorization: Basic", "curl -H")),
    Shape("bearer_token", "requests.get(url, headers=h)  # Bearer FakeBearerValue998877",
          ("FakeBearerValue998877",), ("requests.get(url",)),
    Shape("azure_connection_string",
          "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=FakeAcctKeyB64Zq==",
          ("FakeAcctKeyB64Zq",), ("AccountName=acct",)),
    # well-known token shapes, under innocuous keys
    Shape("openai_key", "llm sk-FAKEJvWiVv3jsB9qKdVHW37ZrPxZT6L7Wgxa9GagUFxUbvRF",
          ("FAKEJvWiVv3jsB9qKdVHW37ZrPxZT6L7Wgxa9GagUFxUbvRF",), ("llm ",)),
    Shape("openai_project_key",
          "sk-proj-dbpufkvkKeE2xfskKeR6iIU0C0FuzNycqXMX9DGJ_Wc401hQvJEgeyz2mCyRa",
          ("dbpufkvkKeE2xfskKeR6iIU0C0FuzNycqXMX9DGJ", "Wc401hQvJEgeyz2mCyRa")),
    Shape("anthropic_key", "claude:sk-ant-api03-q6LUopYL0lb9Qfgh8SlbiS5FNNaQDG1Wk1WIsICVzZdSy0"
          "HVNrIGkvMEsF5RgwXIfMK1wUDR9ZyaC4NP-DgoS8ZAA",
          ("q6LUopYL0lb9Qfgh8SlbiS5FNNaQDG1Wk1WIsICVzZdSy0", "DgoS8ZAA"), ("claude:",)),
    Shape("github_classic", "ghp_0xR4Ik9Dgp60TthpBdAwDJSblMZ6SgFuZX4G",
          ("0xR4Ik9Dgp60TthpBdAwDJSblMZ6SgFuZX4G",)),
    Shape("github_oauth", "clone with gho_g79THpYURI9CW2p8jnznqUoVIXG8zCWmj9Cg please",
          ("g79THpYURI9CW2p8jnznqUoVIXG8zCWmj9Cg",), ("clone with", "please")),
    Shape("github_app", "ghs_CNI3nLSa9M4wVA1KqoVYmx6xcIkdDushfyKX",
          ("CNI3nLSa9M4wVA1KqoVYmx6xcIkdDushfyKX",)),
    Shape("github_fine_grained", "github_pat_11UE8Nd2d1yBbwqaiV3iSD_FhtVvDzhbLJfjwGsJW5Mcn2v5CT1"
          "OwyWBedhHXKxecTm7Bof1ytQeWwKuUj",
          ("11UE8Nd2d1yBbwqaiV3iSD", "FhtVvDzhbLJfjwGsJW5Mcn2v5CT1")),
    Shape("gitlab_token", "glpat-q8FrkmCCxeTEXlRF4jx3", ("q8FrkmCCxeTEXlRF4jx3",)),
    Shape("slack_bot_token", "xoxb-682630334830-8204724858706-Rtvq2FMxr2K8llsi6y35nXnN",
          ("Rtvq2FMxr2K8llsi6y35nXnN", "8204724858706")),
    Shape("slack_user_token",
          "notify=xoxp-115322247725-390774691762-7540279394911-54b9062674b8440ae851efcacb820fd8",
          ("54b9062674b8440ae851efcacb820fd8", "390774691762"), ("notify=",)),
    Shape("jwt", "session eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJmYWtlLXVzZXIifQ."
          "n4oywVipbDlhLQoPdHhVsO1R-i45bePpMlYSRWSHxes",
          ("eyJzdWIiOiJmYWtlLXVzZXIifQ", "n4oywVipbDlhLQoPdHhVsO1R"), ("session ",)),
    Shape("aws_access_key_id", "aws AKIAQ6X69ZFO9SW27FUZ region us-east-1",
          ("AKIAQ6X69ZFO9SW27FUZ",), ("aws ", "region us-east-1")),
    Shape("aws_session_key_id", "ASIA9M6ZEB5IMIJ92KRN", ("ASIA9M6ZEB5IMIJ92KRN",)),
    Shape("google_api_key", "maps AIzanMFFGW73KBmkQcPXrfxP-u2wcsSXZBIprWR",
          ("nMFFGW73KBmkQcPXrfxP-u2wcsSXZBIprWR",), ("maps",)),
    Shape("google_oauth_token", "ya29.NfuibymuH0786GcAgEpx6Boc2UGdWldwdI7QcNFkVcc0bcvUjZGr55",
          ("NfuibymuH0786GcAgEpx6Boc2UGdWldwdI7QcNFkVcc0bcvUjZGr55",)),
    Shape("huggingface_token", "hub 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",
          ("QKSKJQXHiuwzHrCfmtCKlEzQVGhGDNabEU",), ("hub",)),
    Shape("tencent_secret_id", "cvm AKIDz8krbsJ5yKBZQpn74WFkmLPx3EXAMPLE",
          ("z8krbsJ5yKBZQpn74WFkmLPx3EXAMPLE",), ("cvm",)),
    Shape("stripe_key", "sk_live_yyaGYmCNJdFLio8iKu7waHX3", ("yyaGYmCNJdFLio8iKu7waHX3",)),
    Shape("npm_token", "npm_NDMRkOSBFvpWqyemGV9j6PRorqsZUfqiXwjw",
          ("NDMRkOSBFvpWqyemGV9j6PRorqsZUfqiXwjw",)),
    Shape("pypi_token", "pypi-AgEIcHlwaS5vcmcN0ykKR55OBaVRaU3_Qtxlrp_j6qYOV_Tzw-gmnu8yydwQ",
          ("N0ykKR55OBaVRaU3_Qtxlrp_j6qYOV_Tzw",)),
    Shape("sendgrid_key",
          "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",
          ("307d7NJc6jJAYLVJnWxd", "w9vgz3aj3MqUTaZb8708tw8oMpMqVqQAkObWmof6inI")),
    Shape("databricks_token", "dapi736cb73cd6975b7a46a6e75676d3cc00",
          ("736cb73cd6975b7a46a6e75676d3cc00",)),
    Shape("digitalocean_token",
          "dop_v1_846d00090b5ea5e6d15f640402b34f8fcdf14e85c3a95625f758e323c7e02f42",
          ("846d00090b5ea5e6d15f640402b34f8fcdf14e85c3a95625f758e323c7e02f42",)),
    Shape("vault_token", "vault hvs.27r1f4fy2IwIZiDlXq1B2D8Q", ("27r1f4fy2IwIZiDlXq1B2D8Q",),
          ("vault",)),
    Shape("telegram_bot_url",
          "https://api.telegram.org/bot772514742:AASS_SjZKtyBiTujdgq9uMl_BQMyDdzeFoC/sendMessage",
          ("SjZKtyBiTujdgq9uMl_BQMyDdzeFoC",), ("api.telegram.org/bot", "/sendMessage")),
    Shape("private_key_pem", "-----BEGIN OPENSSH PRIVATE KEY-----b3BlbnNzaC1rZXktdjFAKEKEY"
          "MATERIALqq9-----END OPENSSH PRIVATE KEY-----",
          ("b3BlbnNzaC1rZXktdjFAKEKEYMATERIALqq9",)),
)

#: Texts of the same places that hold no secret: the rule leaves them as they are.
INNOCUOUS: tuple[str, ...] = (
    "adamw", "0.1", "4096", "bf16-mixed", "2.3.1+cu121", "/mnt/cfs/imagenet/train",
    "/usr/lib/python3.11/site-packages/torch/utils/hooks.py",
    "/usr/lib/python3.11/site-packages/foo/hooks/bar.py",
    "torchrun --nproc_per_node 8 train.py --config configs/llama.yaml --lr 3e-4",
    "expandable_segments:True", "mlx5_0,mlx5_1", "git+https://github.com/org/repo.git@main",
    "https://huggingface.co/meta-llama/Llama-2-7b-hf", "s3://bucket/imagenet/train",
    "trainer@example.com", "sk-learn-random-forest-baseline", "tokenizer.model",
    "model.layer0.attention.q_proj", "exp-2024-01-01-lr3e-4-bs1024",
    "for batch in reporter.track(loader):", "https://host:8080/a/b@c",
    "dataset.py:42 __getitem__", "bearer of bad news",
)


def secrets_of(text: str) -> list[str]:
    """The corpus's secrets that ``text`` holds."""
    return [secret for shape in CORPUS for secret in shape.secrets if secret in text]


def test_the_corpus_holds_more_than_30_distinct_shapes() -> None:
    assert len(CORPUS) >= 30
    assert len({shape.name for shape in CORPUS}) == len(CORPUS)
    for shape in CORPUS:
        assert all(secret in shape.text for secret in shape.secrets), shape.name
        assert all(part in shape.text for part in shape.kept), shape.name
        # every shape fits every place it is sent in (the e2e test below)
        assert len(shape.text) <= MAX_DESCRIPTION_VALUE_LENGTH, shape.name
        assert "\n" not in shape.text and not shape.text.isspace()


# -- the rule, shape by shape ------------------------------------------------------


@pytest.mark.parametrize("shape", CORPUS, ids=lambda shape: shape.name)
def test_the_secret_is_gone_and_the_rest_kept(shape: Shape) -> None:
    redacted = redact_text(shape.text)
    assert secrets_of(redacted) == [], redacted
    assert REDACTED in redacted
    for part in shape.kept:
        assert part in redacted, (part, redacted)
    assert redact_text(redacted) == redacted  # the client redacts, the daemon again


@pytest.mark.parametrize("shape", CORPUS, ids=lambda shape: shape.name)
def test_the_secret_is_gone_after_abspath_and_in_labels(shape: Shape) -> None:
    folded = os.path.abspath(os.path.join("/work", shape.text))  # "s3://" -> "s3:/"
    assert secrets_of(redact_text(folded)) == []
    label = sanitize_label(redact_text(shape.text), 256)
    assert LABEL_PATTERN.fullmatch(label) and secrets_of(label) == [], label
    assert secrets_of(job_name({}, shape.text)) == []
    assert secrets_of(job_name({"TRAINMON_JOB": shape.text})) == []
    assert secrets_of(redact_code(shape.text)) == []


@pytest.mark.parametrize("shape", CORPUS, ids=lambda shape: shape.name)
def test_a_value_cut_after_redaction_stays_within_its_limit(shape: Shape) -> None:
    """The client redacts a config value, cuts it to 256 characters (``…`` marks the
    cut) and redacts the description again: the second pass never lengthens it past
    the limit, wherever the cut fell (the daemon would refuse the description)."""
    redacted = redact_text(shape.text)
    for limit in range(1, len(redacted)):
        cut = redacted[:limit - 1] + "…"
        again = redact_text(cut)
        assert len(again) <= len(cut), (cut, again)
        assert secrets_of(again) == []


@pytest.mark.parametrize("text", INNOCUOUS)
def test_text_without_a_secret_is_left_as_it_is(text: str) -> None:
    assert redact_text(text) == text


#: Texts built to make a backtracking rule quadratic: many starts of a shape, none whole.
HOSTILE: dict[str, str] = {
    "schemes without userinfo": "@" + "a:/" * 5461,
    "bare userinfo starts": "@" + "=a:" * 5461,
    "webhook segments": ("http://a.b/" * 1489)[:16379] + "hooks",
    "sk- without a digit": "sk-" * 5461,
    "one long secret name": "key" * 5461 + "=",
    "flags without values": "--key " * 2730,
    "JSON keys": '"key": "' * 2048,
    "at signs": "x:" + "@" * 16382,
    "segments ending in @": "a@/" * 5461,
    "authorization headers": "Authorization: " * 1092,
}


@pytest.mark.parametrize("text", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_hostile_text_costs_time_linear_in_its_length(text: str) -> None:
    """16 KB (the longest line) in well under 100 ms: each ``@`` and each secret-looking
    word is looked at once, and no expression backtracks over more than a few hundred
    characters (a quadratic rule takes seconds here)."""
    started = time.perf_counter()
    redact_text(text)
    assert time.perf_counter() - started < 0.1


def test_signature_parameters_are_redacted_and_the_others_kept() -> None:
    assert redact_text("https://a.blob.core.windows.net/c?sv=2022&se=2030&sr=b&sp=r&sig=x%3D"
                       ) == "https://a.blob.core.windows.net/c?sv=2022&se=2030&sr=b&sp=r" \
                            f"&sig={REDACTED}"
    assert redact_text("?X-Amz-Date=20240101&X-Amz-Expires=60&foo=bar") == \
        f"?X-Amz-Date={REDACTED}&X-Amz-Expires={REDACTED}&foo=bar"
    assert redact_text("--token --lr 3") == "--token --lr 3"  # a flag without a value
    assert redact_text("url=https://h/p?token=abc&b=1") == f"url=https://h/p?token={REDACTED}&b=1"


# -- the protocol, both sides --------------------------------------------------------


def description_line(shapes: tuple[Shape, ...], *, job: str, rank: int, run: str,
                     reporter_id: str) -> dict[str, object]:
    """A run description carrying ``shapes`` in every field that takes text."""
    return {
        "v": 1, "type": "run", "job": job, "rank": rank, "reporter_id": reporter_id,
        "run": run, "started": time.time() - 30, "world_size": None,
        "config_hash": "sha256:0123456789abcdef",
        "config": {f"note_{index:02d}": shape.text for index, shape in enumerate(shapes)},
        "environment": {f"TORCH_NOTE_{index:02d}": shape.text
                        for index, shape in enumerate(shapes)},
        "data_paths": [shape.text if shape.text.startswith("/") else
                       os.path.abspath(os.path.join("/work", shape.text))
                       for shape in shapes],
        "versions": {f"dep{index:02d}": shape.text for index, shape in enumerate(shapes)
                     if len(shape.text) <= MAX_VERSION_LENGTH},
        "git": None, "host": "node-1",
        "framework": {f"hint_{index:02d}": shape.text for index, shape in enumerate(shapes)},
    }


def frame_of(shape: Shape, carrier: str) -> dict[str, object]:
    """The innermost frame of a stall: the shape as its file (a presigned-URL loader's
    ``co_filename``) or as its function and source line."""
    if carrier == "file":
        return {"file": shape.text[-MAX_FRAME_FILE_LENGTH:], "line": 7, "function": "load",
                "code": shape.text[:MAX_FRAME_CODE_LENGTH]}
    return {"file": "/srv/job/train.py", "line": 42,
            "function": shape.text[:MAX_FRAME_FUNCTION_LENGTH],
            "code": shape.text[:MAX_FRAME_CODE_LENGTH]}


def test_the_daemon_redacts_every_shape_a_foreign_client_sends() -> None:
    line = description_line(CORPUS[:8], job="j", rank=0, run="r", reporter_id="a" * 16)
    parsed = parse(json.dumps(line).encode())
    assert isinstance(parsed, RunDescription)
    assert secrets_of(repr(parsed)) == []
    for shape in CORPUS:
        for carrier in ("file", "function"):
            stall = {"v": 1, "type": "stall", "job": "j", "rank": 0, "reporter_id": "a" * 16,
                     "steps": 1, "since": 1.0, "where": "code",
                     "frames": [frame_of(shape, carrier)]}
            parsed_stall = parse(json.dumps(stall).encode())
            assert isinstance(parsed_stall, StallReport)
            assert secrets_of(repr(parsed_stall)) == [], (shape.name, parsed_stall)


def test_a_config_key_that_holds_a_secret_is_redacted_too() -> None:
    line = description_line((), job="j", rank=0, run="r", reporter_id="a" * 16)
    line["config"] = {"ghp_0xR4Ik9Dgp60TthpBdAwDJSblMZ6SgFuZX4G": 1, "lr": 0.1}
    parsed = parse(json.dumps(line).encode())
    assert isinstance(parsed, RunDescription)
    assert parsed.config == {"_redacted_": 1, "lr": 0.1}


@pytest.mark.parametrize("shape", CORPUS, ids=lambda shape: shape.name)
def test_the_client_watchdog_redacts_a_frames_file_and_function(shape: Shape) -> None:
    """A presigned-URL loader compiles its code under the URL (``co_filename``); the
    frame the watchdog sends carries neither that secret nor one in the function."""
    source = compile("def probe():\n    return sys._getframe()\n", shape.text, "exec")
    code = next(const for const in source.co_consts if hasattr(const, "co_name"))
    function_name = shape.text[:MAX_FRAME_FUNCTION_LENGTH]  # code objects take any name
    probe = FunctionType(code.replace(co_name=function_name), {"sys": sys})
    sent = watchdog._frame(probe())
    assert secrets_of(json.dumps(sent)) == [], sent
    assert sent["line"] == 2


# -- end to end: a real daemon ---------------------------------------------------------

JOB = "corpus"
#: Shapes per run description (the protocol's most data paths).
PER_DESCRIPTION = 8


def reporter_of(rank: int) -> str:
    return f"corpus{rank:010d}"


def step_line(rank: int, run: str) -> dict[str, object]:
    buckets = [0] * STEP_BUCKET_COUNT
    buckets[4] = 10
    return {"v": 1, "job": JOB, "rank": rank, "reporter_id": reporter_of(rank), "run": run,
            "steps": 10, "samples": 320, "step_seconds": 2.0, "data_wait_seconds": 0.5,
            "step_buckets": buckets, "dropped_reports": 0,
            "last_step_time": time.time() - 20}


def stall_line(rank: int, run: str, frame: dict[str, object]) -> dict[str, object]:
    return {"v": 1, "type": "stall", "job": JOB, "rank": rank,
            "reporter_id": reporter_of(rank), "run": run, "steps": 10,
            "since": time.time() - 20, "where": "data_loader" if rank % 2 == 0 else "code",
            "frames": [frame, {"file": "/srv/job/train.py", "line": 88, "function": "main",
                               "code": "for batch in loader:"}]}


def payloads() -> Iterator[bytes]:
    """Per corpus shape two ranks, each a run of its own (the ledger keeps each run's
    stall): rank 2i carries the shape in its frame's file, rank 2i+1 in its function and
    source line; the first ranks' run descriptions carry the shapes 8 at a time."""
    chunks = [CORPUS[start:start + PER_DESCRIPTION]
              for start in range(0, len(CORPUS), PER_DESCRIPTION)]
    for index, shape in enumerate(CORPUS):
        for offset, carrier in enumerate(("file", "function")):
            rank = 2 * index + offset
            run = f"{shape.name.replace('_', '-')}-{carrier}"
            lines: list[dict[str, object]] = []
            if rank < len(chunks):
                lines.append(description_line(chunks[rank], job=JOB, rank=rank, run=run,
                                              reporter_id=reporter_of(rank)))
            lines += [step_line(rank, run), stall_line(rank, run, frame_of(shape, carrier))]
            yield b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def api_runs(daemon: Daemon) -> tuple[str, list[dict[str, object]]]:
    """Every page of ``GET /api/v1/runs?job=corpus`` (its ``Link: rel=next`` followed):
    the bodies as served, and the records."""
    bodies: list[str] = []
    records: list[dict[str, object]] = []
    url: str | None = f"{daemon.url}/api/v1/runs?job={JOB}"
    while url is not None:
        with urllib.request.urlopen(url, timeout=10) as answer:
            body = answer.read().decode()
            link = answer.headers.get("Link") or ""
        bodies.append(body)
        records += json.loads(body)
        following = re.search(r'<([^>]+)>;\s*rel="next"', link)
        url = None if following is None else daemon.url + following.group(1)
    return "\n".join(bodies), records


def ledger_path(daemon: Daemon) -> Path:
    config = yaml.safe_load(Path(str(daemon.config_path)).read_text())
    return Path(config["collectors"]["ledger"]["path"])


def ledger_contents(path: Path) -> str:
    """Every row of every table of the ledger (sqlite3), and its files' bytes."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as connection:
        rows = "\n".join(connection.iterdump())
    raw = b"".join(file.read_bytes() for file in path.parent.glob(path.name + "*"))
    return rows + "\n" + raw.decode("latin-1")


@pytest.fixture
def daemon(start_daemon: Callable[..., Daemon]) -> Daemon:
    return start_daemon(config={"collectors": {"gpu": {"enabled": False},
                                               "ledger": {"flush_seconds": 0.2}}})


@pytest.mark.integration
def test_no_secret_of_the_corpus_comes_out_of_a_real_daemon(daemon: Daemon) -> None:
    config = yaml.safe_load(Path(str(daemon.config_path)).read_text())
    target = config["collectors"]["training"]["socket"]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
        for payload in payloads():
            sender.sendto(payload, target)
    ranks = 2 * len(CORPUS)

    def stalled_everywhere() -> bool:
        exposition = daemon.metrics()
        _, records = api_runs(daemon)
        stalls = [record for record in records if record["summary"].get("stalls")]
        return (exposition.count("trainmon_training_stall_info{") >= ranks
                and len(stalls) >= ranks)

    wait_until(stalled_everywhere, 30.0, "every rank's stall in /metrics and the ledger",
               interval=0.2)
    exposition = daemon.metrics()
    served, records = api_runs(daemon)
    assert {record["run"] for record in records} >= {
        f"{shape.name.replace('_', '-')}-file" for shape in CORPUS}
    assert any(record["description"] for record in records)  # the descriptions arrived
    ledger = ledger_path(daemon)
    listed = subprocess.run([*trainmon_command(), "runs", "--ledger", str(ledger)],
                            capture_output=True, text=True, timeout=60)
    listed_json = subprocess.run(
        [*trainmon_command(), "runs", "--json", "--ledger", str(ledger)],
        capture_output=True, text=True, timeout=60)
    doctor = subprocess.run(
        [*trainmon_command(), "doctor", "--url", daemon.url, "--seconds", "1",
         "--ledger", str(ledger)], capture_output=True, text=True, timeout=120)
    doctor_json = subprocess.run(
        [*trainmon_command(), "doctor", "--url", daemon.url, "--seconds", "1", "--json",
         "--ledger", str(ledger)], capture_output=True, text=True, timeout=120)
    assert JOB in listed_json.stdout, listed_json.stderr
    assert JOB in doctor_json.stdout, doctor_json.stderr
    surfaces = {
        "/metrics": exposition,
        "the ledger": ledger_contents(ledger),
        "/api/v1/runs": served,
        "the daemon's log": daemon.log(),
        "trainmon runs": listed.stdout + listed.stderr,
        "trainmon runs --json": listed_json.stdout + listed_json.stderr,
        "trainmon doctor": doctor.stdout + doctor.stderr,
        "trainmon doctor --json": doctor_json.stdout + doctor_json.stderr,
    }
    leaks = {where: found for where, text in surfaces.items() if (found := secrets_of(text))}
    assert leaks == {}
    # what is not a secret came through: each shape's host, path, parameter names
    frames = "\n".join(_stall_frames(exposition))
    missing = [(shape.name, part) for shape in CORPUS for part in shape.kept
               if len(part) > 3 and part not in frames and part not in served]
    assert missing == []


def _stall_frames(exposition: str) -> list[str]:
    """The ``frame`` labels of ``trainmon_training_stall_info`` (unescaped)."""
    found = re.findall(r'^trainmon_training_stall_info\{.*?frame="((?:[^"\\]|\\.)*)"',
                       exposition, re.MULTILINE)
    return [value.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
            for value in found]
