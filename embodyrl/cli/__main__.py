"""``python -m embodyrl.cli`` runs the ``embodyrl`` command."""

import sys

from .commands import main

sys.exit(main())
