"""What every benchmark here prints the same way: percentiles and the machine it ran on."""

from __future__ import annotations

import math
import os
import platform


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def machine() -> str:
    """CPUs, memory, GPU, OS, Python and torch of this machine, for the line above a table."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3
    try:
        import torch
        torch_version = torch.__version__
        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    except ImportError:
        torch_version, gpu = "no torch", "GPU unknown"
    return (f"{os.cpu_count()} CPUs ({cpu}), {mem:.0f} GiB RAM, {gpu}, {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}, torch {torch_version}")
