"""The web page's routes: the jobs list at ``/``, a job's page at ``/jobs/JOB``, the fragments and log
slices their script polls under ``/ui/``, sign-in and sign-out, and the package's static files.

Every data request reads through the API's own handlers with the browser's session as the principal, so
the page shows exactly what the admin token would; without a session it shows no job.
"""

from __future__ import annotations

from importlib import resources
from urllib.parse import urlparse

from fastapi import APIRouter, Depends, HTTPException, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse

from .. import wire
from ..controller import api
from ..controller.auth import Principal, require_admin
from ..controller.reports import MAX_INT
from . import sessions, views
from .render import WebRoute, page, render

router = APIRouter(route_class=WebRoute)
LINK_MINUTES = sessions.LINK_SECONDS // 60
STATIC = {"app.js": "text/javascript", "style.css": "text/css", "icon.svg": "image/svg+xml"}


def _signed_in(request: Request) -> Principal:
    """The session's principal for a fragment or log request; 401 without one."""
    who = sessions.page_principal(request)
    if who is None:
        raise HTTPException(401, "not signed in: run `runner dashboard` for a sign-in link")
    return who


def _jobs(request: Request, who: Principal) -> tuple[list[dict], int]:
    """The API's default listing (the active jobs and those ended in the last day), newest first, and how many
    jobs it leaves out."""
    jobs, hidden = api.job_listing(request.app.state.controller.store)
    return list(reversed(jobs)), hidden


def _job_view(request: Request, who: Principal, job_id: str) -> dict:
    status = api.get_job(job_id, request, who)  # 404 for an unknown job, as the API
    return views.job_page(request.app.state.controller.store, status)


def _int_param(request: Request, name: str, default: int | None = None) -> int:
    raw = request.query_params.get(name)
    if raw is None and default is not None:
        return default
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise HTTPException(422, f"{name}: {raw!r} is not a whole number") from None
    if not 0 <= value <= MAX_INT:  # as the API's own bounds: a larger number is no offset, attempt or rank
        raise HTTPException(422, f"{name}: must be a whole number from 0 to {MAX_INT}")
    return value


@router.get("/", response_class=HTMLResponse)
def jobs_page(request: Request):
    who = sessions.page_principal(request)
    if who is None:
        return page("signed_out.html", signed_in=False, link_minutes=LINK_MINUTES)
    jobs, hidden = _jobs(request, who)
    return page("jobs.html", signed_in=True, jobs=jobs, hidden=hidden)


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(job_id: str, request: Request):
    who = sessions.page_principal(request)
    if who is None:  # says nothing about whether the job exists
        return page("signed_out.html", status_code=401, signed_in=False, link_minutes=LINK_MINUTES)
    try:
        view = _job_view(request, who, job_id)
    except HTTPException as refused:
        if refused.status_code != 404:
            raise
        return page("not_found.html", status_code=404, signed_in=True, job_id=job_id)
    return page("job.html", signed_in=True, **view)


@router.get("/ui/jobs", response_class=HTMLResponse)
def jobs_rows(request: Request):
    jobs, hidden = _jobs(request, _signed_in(request))
    return HTMLResponse(render("jobs_rows.html", jobs=jobs, hidden=hidden), headers={"Cache-Control": "no-store"})


@router.get("/ui/jobs/{job_id}/summary", response_class=HTMLResponse)
def job_summary(job_id: str, request: Request):
    view = _job_view(request, _signed_in(request), job_id)
    return HTMLResponse(render("job_summary.html", **view), headers={"Cache-Control": "no-store"})


@router.get("/ui/jobs/{job_id}/logs")
def job_logs(job_id: str, request: Request):
    """A slice of one attempt's output, as ``GET /v1/jobs/JOB/logs`` answers it."""
    who = _signed_in(request)
    return api.logs(job_id, request, attempt=_int_param(request, "attempt"), offset=_int_param(request, "offset", 0),
                    node=_int_param(request, "node", 0), who=who)


@router.post("/v1/dashboard/links", status_code=201)
def create_link(request: Request, who: Principal = Depends(require_admin)):
    """A one-time sign-in link for a browser (``runner dashboard``); only the admin token can ask for one."""
    code, expires_at = sessions.new_link(request)
    return {"path": f"{sessions.SIGNIN_PATH}?code={code}", "expires_at": wire.iso(expires_at),
            "expires_in_seconds": sessions.LINK_SECONDS}


@router.get(sessions.SIGNIN_PATH, response_class=HTMLResponse)
def sign_in(request: Request, code: str = ""):
    """Spend a one-time link: set the session cookie and leave for ``/``, so the code stays in no address bar."""
    secret = sessions.redeem(request, code) if code else None
    if secret is None:
        return page("link_spent.html", status_code=400, signed_in=False, link_minutes=LINK_MINUTES)
    response = RedirectResponse("/", status_code=303, headers={"Cache-Control": "no-store"})
    sessions.set_cookie(response, request, secret)
    return response


@router.post("/signout")
def sign_out(request: Request):
    origin = request.headers.get("origin")
    if origin and urlparse(origin).netloc != request.url.netloc:
        raise HTTPException(403, "sign-out from another site refused")
    sessions.end_session(request)
    response = RedirectResponse("/", status_code=303)
    sessions.clear_cookie(response, request)
    return response


@router.get("/static/{name}")
def static(name: str):
    if name not in STATIC:
        raise HTTPException(404, f"no static file {name!r}")
    body = resources.files("runner.web").joinpath("static", name).read_bytes()
    return Response(body, media_type=STATIC[name], headers={"Cache-Control": "public, max-age=300"})
