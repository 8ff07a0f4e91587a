"""``python -m rollnet.reference.cli`` is the ``rollnet`` command."""

import sys

from rollnet.reference.cli import main

sys.exit(main())
