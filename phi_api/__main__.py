"""``python -m phi_api``: the command-line interface."""

import sys

from phi_api.tools.cli import main

sys.exit(main())
