"""The `runner` command line: one module per command group, one error catch at the top (main.py)."""
