"""``python -m runner.cli``: the ``runner`` command, for an environment whose console scripts are not on PATH."""

import sys

from .main import main

sys.exit(main())
