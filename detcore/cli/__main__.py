"""``python -m detcore.cli COMMAND ...``: the ``detcore`` command without its console script."""
import sys

from detcore.cli import main

if __name__ == "__main__":  # not on a plain import (the package import test imports every module)
    sys.exit(main())
