"""``python -m portcullis.adapters.cli``: the same as the ``portcullis`` command."""

import sys

from portcullis.adapters.cli import main

if __name__ == "__main__":  # importing the module (as the import checks do) runs nothing
    sys.exit(main())
