"""``python -m equivtool.cli ...``: the ``equivtool`` command."""

import sys

from equivtool.cli import main

sys.exit(main())
