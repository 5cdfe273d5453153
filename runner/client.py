"""The HTTP client of the controller's API, used by the CLI (admin token) and the agent (node token)."""

from __future__ import annotations

import requests


class ClientError(Exception):
    """A request failed; ``exit_code`` follows the contract (1 failed, 2 bad input, 3 unreachable)."""

    exit_code = 1

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class ControllerUnreachable(ClientError):
    exit_code = 3


class BadRequest(ClientError):
    exit_code = 2


class NotFound(ClientError):
    exit_code = 1


class Client:
    def __init__(self, url: str, token: str, timeout: float = 30.0):
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"

    def request(self, method: str, path: str, **kwargs):
        kwargs.setdefault("timeout", self.timeout)
        try:
            response = self.session.request(method, self.url + path, **kwargs)
        except requests.ConnectionError:
            raise ControllerUnreachable(
                f"cannot reach the controller at {self.url}; start it with `runner server` "
                "or check RUNNER_SERVER") from None
        except requests.Timeout:
            raise ControllerUnreachable(f"the controller at {self.url} did not answer in {self.timeout:.0f}s") from None
        if response.status_code >= 400:
            raise _error(response)
        if response.headers.get("content-type", "").startswith("application/json"):
            return response.json()
        return response.content

    def get(self, path: str, **kwargs):
        return self.request("GET", path, **kwargs)

    def post(self, path: str, json: dict | None = None, **kwargs):
        return self.request("POST", path, json=json or {}, **kwargs)


def _error(response: requests.Response) -> ClientError:
    try:
        detail = response.json().get("detail", response.text)
    except ValueError:
        detail = response.text.strip() or response.reason
    if not isinstance(detail, str):
        detail = str(detail)
    status = response.status_code
    if status == 401:
        return ClientError(f"the controller refused the token ({detail}); check RUNNER_TOKEN", status)
    if status == 403:
        return ClientError(f"not allowed: {detail}", status)
    if status == 404:
        return NotFound(detail, status)
    if status in (400, 413, 422):
        return BadRequest(detail, status)
    return ClientError(f"controller error {status}: {detail}", status)
