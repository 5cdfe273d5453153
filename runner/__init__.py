"""runner: fault-tolerant GPU training on spot instances."""

__version__ = "0.1.0"
