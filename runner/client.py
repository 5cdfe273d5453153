"""The HTTP client of the controller's API, used by the CLI (admin token) and the agent (node token)."""

from __future__ import annotations

from collections.abc import Mapping

import requests

from .errors import InputError, RunnerError, Unreachable
from .protocol.urls import redact


class ClientError(RunnerError):
    """A request failed; ``exit_code`` follows the contract (1 failed, 2 bad input, 3 unreachable)."""

    exit_code = 1

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class ControllerUnreachable(ClientError, Unreachable):
    exit_code = 3


class BadRequest(ClientError, InputError):
    exit_code = 2


class NotFound(ClientError):
    exit_code = 1


class Client:
    """``url`` may list several controllers separated by commas (docs/operations.md): requests go to the one that
    answered last, and move on to the next when it cannot be reached. Only a refused or failed connection
    moves on, never a request that timed out (another controller would do it a second time)."""

    def __init__(self, url: str, token: str, timeout: float = 30.0, token_source: str | None = None):
        self.token_source = token_source  # the CLI's: where its token was read (RUNNER_TOKEN, a file), for a refusal
        self.urls = [u.strip().rstrip("/") for u in url.split(",") if u.strip()] or [url]
        self.url = self.urls[0]
        self.timeout = timeout
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"
        self.last_headers: Mapping[str, str] = {}  # the last answer's headers (a listing's count of what it left out)

    def request(self, method: str, path: str, **kwargs):
        kwargs.setdefault("timeout", self.timeout)
        start = self.urls.index(self.url)
        for url in self.urls[start:] + self.urls[:start]:
            try:
                response = self.session.request(method, url + path, **kwargs)
            except requests.ConnectionError:  # refused, reset or not connected in time: try the next one
                continue
            except requests.Timeout:
                raise ControllerUnreachable(
                    f"the controller at {redact(url)} did not answer in {self.timeout:.0f}s") from None
            self.url = url
            self.last_headers = response.headers  # case-insensitive
            if response.status_code >= 400:
                raise _error(response, self.token_source)
            if response.headers.get("content-type", "").startswith("application/json"):
                return response.json()
            return response.content
        shown = [redact(u) for u in self.urls]  # a URL's user may be a token (https://TOKEN@host)
        where = shown[0] if len(shown) == 1 else "any of " + ", ".join(shown)
        raise ControllerUnreachable(
            f"cannot reach the controller at {where}; start it with `runner server` "
            "or check RUNNER_SERVER")

    def get(self, path: str, **kwargs):
        return self.request("GET", path, **kwargs)

    def post(self, path: str, json: dict | None = None, **kwargs):
        return self.request("POST", path, json=json or {}, **kwargs)


def _error(response: requests.Response, token_source: str | None = None) -> ClientError:
    try:
        detail = response.json().get("detail", response.text)
    except ValueError:
        detail = response.text.strip() or response.reason
    if not isinstance(detail, str):
        detail = str(detail)
    status = response.status_code
    if status == 401 and token_source:
        return ClientError(f"the controller refused the token from {token_source} ({detail}); set RUNNER_TOKEN to "
                           "that controller's admin token (the admin-token file in its data dir)", status)
    if status == 401:
        return ClientError(f"the controller refused the token ({detail}); check RUNNER_TOKEN", status)
    if status == 403 and token_source:
        return ClientError(f"not allowed: {detail}; the token from {token_source} is a node's: set RUNNER_TOKEN to "
                           "the controller's admin token (the admin-token file in its data dir)", status)
    if status == 403:
        return ClientError(f"not allowed: {detail}", status)
    if status == 404:
        return NotFound(detail, status)
    if status in (400, 413, 422):
        return BadRequest(detail, status)
    if status == 409:  # the job's state does not allow it now: the controller's reason says why, plainly
        return ClientError(detail, status)
    return ClientError(f"controller error {status}: {detail}", status)
