"""The benchmarks' one writer of their JSON results: the folder made if needed, strict JSON
(detcore.utils.strict_json: NaN and infinities as null), indented."""
import os

from detcore.utils import strict_json


def write_results(path: str, record) -> None:
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    with open(path, "w") as f:
        f.write(strict_json.dumps(record, indent=2))
