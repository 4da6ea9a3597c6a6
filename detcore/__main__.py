"""``python -m detcore COMMAND ...``: the ``detcore`` command (detcore/cli/)."""
import sys

from detcore.cli import main

if __name__ == "__main__":  # not on a plain import (the package import test imports every module)
    sys.exit(main())
