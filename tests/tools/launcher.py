"""Run a tool script the way its command line would, with the tests' tiny datasets and
ToyDetector registered first (they live in the tests, so the tool cannot know them):

    python tests/tools/launcher.py tools/train_net.py --config-file X ...
    torchrun --nproc_per_node 2 tests/tools/launcher.py tools/train_net.py ...
"""
import os
import runpy
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from tests.engine.toy_model import register_tiny_datasets  # noqa: E402

if __name__ == "__main__":
    register_tiny_datasets()
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    runpy.run_path(script, run_name="__main__")
