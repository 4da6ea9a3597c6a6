"""``python -m detcore.checkpoint``: the model zoo catalog, as a markdown table."""
from detcore.checkpoint.model_zoo import catalog_table

print(catalog_table())
