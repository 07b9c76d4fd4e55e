"""The JSON shape every table value of the core takes (`to_json` / `from_json`), shared by its modules."""

from __future__ import annotations

from typing import Any

Json = dict[str, Any]
