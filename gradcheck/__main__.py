"""``python -m gradcheck``: the ``gradcheck`` command, for an environment whose scripts are not on PATH."""

import sys

from gradcheck.app.cli import main

sys.exit(main())
