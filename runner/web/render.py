"""HTML out: Jinja2 templates with autoescaping always on, and the security headers of every web response."""

from __future__ import annotations

from typing import Callable

import jinja2
from fastapi import HTTPException, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.routing import APIRoute

from ..spec import format_duration

# Only this package's own files: no inline script or style, no other origin, no framing.
CONTENT_SECURITY_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                           "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}


def money(value) -> str:
    if value is None:
        return "-"
    return f"${value:.4f}" if value < 1 else f"${value:,.2f}"


def duration(seconds) -> str:
    return "-" if seconds is None else format_duration(seconds)


_env = jinja2.Environment(
    loader=jinja2.PackageLoader("runner.web", "templates"),
    autoescape=True,  # every template, .svg included: job names, messages and zones are data, never markup
    trim_blocks=True,
    lstrip_blocks=True,
    undefined=jinja2.StrictUndefined,
)
_env.filters.update(money=money, duration=duration)


def render(template: str, **context) -> str:
    return _env.get_template(template).render(**context)


def page(template: str, status_code: int = 200, **context) -> HTMLResponse:
    return HTMLResponse(render(template, **context), status_code=status_code, headers={"Cache-Control": "no-store"})


class WebRoute(APIRoute):
    """A route of the web page: an HTTPException becomes a JSON error like the API's, and every response,
    errors included, carries the security headers."""

    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()

        async def secured(request: Request) -> Response:
            try:
                response = await handler(request)
            except HTTPException as refused:
                response = JSONResponse({"detail": refused.detail}, status_code=refused.status_code,
                                        headers={**(refused.headers or {}), "Cache-Control": "no-store"})
            for name, value in SECURITY_HEADERS.items():
                response.headers.setdefault(name, value)
            return response

        return secured
