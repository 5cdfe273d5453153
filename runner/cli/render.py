"""Output for people (tables) and for scripts (--json)."""

from __future__ import annotations

import json
import os
import sys

import click
from rich.console import Console
from rich.table import Table

from .pipes import OutputClosed


def print_json(value, one_line: bool = False) -> None:
    """One JSON document on stdout: indented, or on ``one_line`` (a program reading lines gets it whole at once)."""
    click.echo(json.dumps(value) if one_line else json.dumps(value, indent=2, sort_keys=False))


PLAIN_TABLE_ROWS = 200  # past this many rows a table is laid out by hand: rich takes ~8 ms a row


def print_table(columns: list[str], rows: list[list], empty: str = "", err: bool = False,
                wrap: tuple[str, ...] = (), gap: int = 2) -> None:
    """A table as wide as the terminal (``COLUMNS`` where set): the ``wrap`` columns fold onto further lines
    to fit it; the others keep each cell on one line. Piped output without ``COLUMNS`` is not cut. ``gap``: spaces
    between columns. Past PLAIN_TABLE_ROWS rows, one plain line a row."""
    if not rows and empty:
        click.echo(empty, err=err)
        return
    if len(rows) > PLAIN_TABLE_ROWS:
        cells = [columns] + [["-" if cell is None else str(cell) for cell in row] for row in rows]
        widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
        click.echo("\n".join((" " * gap).join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
                             for row in cells), err=err)
        return
    table = Table(box=None, header_style="bold", pad_edge=False, padding=(0, gap, 0, 0))
    for column in columns:
        if column in wrap:
            table.add_column(column)  # wraps between words
        else:
            table.add_column(column, no_wrap=True)
    for row in rows:
        table.add_row(*["-" if cell is None else str(cell) for cell in row])
    stream = sys.stderr if err else sys.stdout
    console = _Console(file=stream, width=output_width(stream), highlight=False)
    console.print(table)


class _Console(Console):
    def on_broken_pipe(self) -> None:
        """The table's reader has gone: the command ends as for any closed output (rich's own exits 1)."""
        self.quiet = True
        raise OutputClosed()


def output_width(stream) -> int:
    """``COLUMNS`` when set, else the terminal's width, else (a pipe or a file) 250 columns."""
    try:
        columns = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        columns = 0
    if columns > 0:
        return columns
    if stream.isatty():
        try:
            return os.get_terminal_size(stream.fileno()).columns
        except (OSError, ValueError):
            return 80
    return 250


def money(value: float | None) -> str:
    if value is None:
        return "-"
    if 0 < value < 0.0001:
        return "<$0.0001"
    return f"${value:.4f}" if value < 1 else f"${value:.2f}"


def rate(per_second: float | None) -> str:
    """Steps per second for people: three significant figures, no exponent."""
    if per_second is None:
        return "-"
    if per_second >= 100:
        return f"{per_second:,.0f}"
    return f"{per_second:.3g}" if per_second >= 0.01 else f"{per_second:.2g}"


def gigabytes(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} GB"
