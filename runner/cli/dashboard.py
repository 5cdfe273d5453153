"""``runner dashboard``: a one-time link that signs a browser in to the controller's web page."""

from __future__ import annotations

import os
import sys
import webbrowser

import click

from .connect import connect


@click.command()
@click.option("--no-open", is_flag=True, help="Only print the link; do not open a browser.")
def dashboard(no_open: bool):
    """Print (and open) a link that signs a browser in to the web page; it works once, for 5 minutes."""
    client = connect()
    link = client.post("/v1/dashboard/links")
    url = client.url + link["path"]
    minutes = max(1, round(link["expires_in_seconds"] / 60))
    click.echo(f"Sign in to the web page with this link (it works once, within {minutes} minutes):", err=True)
    click.echo(url)
    if no_open:
        return
    if not _can_open_a_browser():
        click.echo("No graphical browser here (no DISPLAY): open the link on this machine's desktop, or forward "
                   "the controller's port (ssh -L) and open it there.", err=True)
    elif not webbrowser.open(url):
        click.echo("Could not open a browser: open the link yourself.", err=True)


def _can_open_a_browser() -> bool:
    """A browser chosen by the user, or a graphical one. On a headless Linux box ``webbrowser`` would start a
    console browser (lynx, w3m) in this terminal, which would also spend the one-time link."""
    if os.environ.get("BROWSER"):
        return True
    if sys.platform.startswith(("linux", "freebsd", "openbsd", "netbsd")):
        return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
    return True
