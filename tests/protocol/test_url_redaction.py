"""One ``redact`` for every URL a message, log, status or page shows: the password of the URL's user and the values
of parameters named as secrets become ``***``; the rest stays as written, so the location is still recognisable."""

from __future__ import annotations

import pytest

from runner.protocol.urls import hide_secrets, redact

CASES = {
    "sftp://trainer:s3cret@files.example.com:22/ckpt": "sftp://trainer:***@files.example.com:22/ckpt",
    "ftp://trainer:p@ss:w0rd@10.0.0.5/ckpt": "ftp://trainer:***@10.0.0.5/ckpt",
    "s3://bucket/run?X-Amz-Credential=AKIA1/2026&X-Amz-Date=20261127&X-Amz-Signature=9f8e":
        "s3://bucket/run?X-Amz-Credential=***&X-Amz-Date=20261127&X-Amz-Signature=***",
    "az://box/ckpt?sv=2022-11-02&sig=AbC%2Fd&se=2026": "az://box/ckpt?sv=2022-11-02&sig=***&se=2026",
    "webdav://host/ckpt?token=t0k&secret_key=sk&api_key=k1#part":
        "webdav://host/ckpt?token=***&secret_key=***&api_key=***#part",
    "postgresql://runner:pw@db:5432/jobs?sslmode=require&password=pw2":
        "postgresql://runner:***@db:5432/jobs?sslmode=require&password=***",
    "host=db user=runner password='a b' dbname=jobs": "host=db user=runner password=*** dbname=jobs",
    # a user name without a password is a token under a scheme whose user is no account's name
    "https://ghp_4d1b7e9a0c2f@github.com/org/repo": "https://***@github.com/org/repo",
    "s3://AKIAIOSFODNN7EXAMPLE@bucket/run": "s3://***@bucket/run",
}
UNCHANGED = ["s3://bucket/tiny-gpt", "gs://bucket/key=value/run", "/mnt/ckpt", "sftp://trainer@host/ckpt",
             "git+ssh://git@github.com/org/repo", "postgresql://runner@db:5432/jobs",
             "local-durable:///tmp/ckpt?endpoint=http://x", "http://[::1"]


@pytest.mark.parametrize("url", CASES)
def test_credentials_show_as_stars_and_the_rest_as_written(url):
    """The user's password and each secret parameter's value become ``***``; nothing else changes."""
    assert redact(url) == CASES[url]


@pytest.mark.parametrize("url", UNCHANGED)
def test_a_url_without_credentials_is_shown_as_written(url):
    """A bucket, a path, an account's name without a password (ssh, sftp, postgres...), a parameter that is no
    secret: shown unchanged."""
    assert redact(url) == url


def test_a_message_repeating_a_secret_of_the_url_shows_it_as_stars():
    """A driver's error that quotes the URL or its decoded password names neither."""
    url = "sftp://trainer:p%40ss@host/ckpt"
    text = hide_secrets(f"cannot open {url}: login as trainer with p@ss refused", url)
    assert text == "cannot open sftp://trainer:***@host/ckpt: login as trainer with *** refused"


def test_a_message_repeating_a_token_written_as_the_user_shows_it_as_stars():
    url = "https://ghp_4d1b7e9a0c2f@github.com/org/repo"
    text = hide_secrets(f"cannot open {url}: ghp_4d1b7e9a0c2f was refused", url)
    assert text == "cannot open https://***@github.com/org/repo: *** was refused"
