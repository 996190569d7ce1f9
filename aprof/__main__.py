"""``python -m aprof``: the same program as the ``aprof`` command."""

import sys

from ._cli._main import main

if __name__ == "__main__":
    sys.exit(main())
