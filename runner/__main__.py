"""``python -m runner``: the ``runner`` command, for an environment whose console scripts are not on PATH."""

import sys

from .cli.main import main

sys.exit(main())
