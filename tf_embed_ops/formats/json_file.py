"""Reading a JSON file another process wrote (a checkpoint or a publisher's manifest), each reader keeping its own
error type and message.

Standard library only.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

__all__ = ["read_json"]


def read_json(
    path: str,
    error: Callable[[BaseException], Exception],
    catch: tuple[type[BaseException], ...] = (OSError, ValueError),
) -> Any:
    """The parsed content of the JSON file at `path` (which the caller has found to exist).

    Args:
      path: the file.
      error: builds the caller's exception from the failure (one of `catch`); it is raised from that failure.
      catch: the failures that become `error` (JSON and UTF-8 decode errors are `ValueError`s); others propagate.
    """
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except catch as e:
        raise error(e) from e
