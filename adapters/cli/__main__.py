"""``python -m portcullis.adapters.cli``: the same as the ``portcullis`` command."""

import sys

from portcullis.adapters.cli import main

sys.exit(main())
