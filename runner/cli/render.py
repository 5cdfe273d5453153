"""Output for people (tables) and for scripts (--json)."""

from __future__ import annotations

import json
import sys

import click
from rich.console import Console
from rich.table import Table


def print_json(value) -> None:
    click.echo(json.dumps(value, indent=2, sort_keys=False))


PLAIN_TABLE_ROWS = 200  # past this many rows a table is laid out by hand: rich takes ~8 ms a row


def print_table(columns: list[str], rows: list[list], empty: str = "", err: bool = False) -> None:
    if not rows and empty:
        click.echo(empty, err=err)
        return
    if len(rows) > PLAIN_TABLE_ROWS:
        cells = [columns] + [["-" if cell is None else str(cell) for cell in row] for row in rows]
        widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
        click.echo("\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
                             for row in cells), err=err)
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in columns:
        table.add_column(column, no_wrap=True)
    for row in rows:
        table.add_row(*["-" if cell is None else str(cell) for cell in row])
    stream = sys.stderr if err else sys.stdout
    console = Console(file=stream, width=None if stream.isatty() else 250, highlight=False)
    console.print(table)


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
