"""Two controllers on one Postgres database: a sign-in link made by one works once, on either; the session
it starts is good on both, and signing out on one ends it on the other."""

from __future__ import annotations

import requests

from conftest import Controller
from runner.web import sessions


def test_a_link_works_once_and_a_session_everywhere_across_controllers_sharing_a_database(tmp_path, postgres):
    """Links and sessions live in the shared database, so any controller honours them, and only once."""
    db_url = postgres.new_database()
    homes = [tmp_path / "a", tmp_path / "b"]
    for home in homes:
        home.mkdir()
    first = Controller(homes[0], db_url=db_url).start()
    second = Controller(homes[1], db_url=db_url).start()
    try:
        assert first.token == second.token  # one admin token for the database (docs/operations.md)
        minted = requests.post(first.url + "/v1/dashboard/links", headers=first.headers(), timeout=10)
        link = minted.json()["path"]

        signed_in = requests.get(second.url + link, allow_redirects=False, timeout=10)
        assert signed_in.status_code == 303
        assert requests.get(first.url + link, timeout=10).status_code == 400  # spent, on the other one too

        cookie = {sessions.COOKIE: signed_in.cookies[sessions.COOKIE]}
        for controller in (first, second):
            assert requests.get(controller.url + "/ui/jobs", cookies=cookie, timeout=10).status_code == 200
        out = requests.post(first.url + "/signout", cookies=cookie, allow_redirects=False, timeout=10)
        assert out.status_code == 303
        assert requests.get(second.url + "/ui/jobs", cookies=cookie, timeout=10).status_code == 401
    finally:
        first.stop()
        second.stop()
