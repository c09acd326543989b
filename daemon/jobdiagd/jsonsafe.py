"""Strict JSON out: a NaN or infinite float (a `loss: nan` step line) becomes null.

`json.dumps` would print bare `NaN`/`Infinity`, which strict parsers (JavaScript, Go, jq)
reject; every JSON document jobdiagd prints goes through `dumps` here instead.
"""

from __future__ import annotations

import json
import math
from typing import Any


def json_safe(obj: Any) -> Any:
    """`obj` with every non-finite float replaced by None (dicts, lists and tuples walked)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    return obj


def dumps(obj: Any, **kwargs: Any) -> str:
    return json.dumps(json_safe(obj), allow_nan=False, **kwargs)
