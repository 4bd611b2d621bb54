"""Loading an object named ``module:attribute`` from the application's own directory.

Commands and settings name an app, an observer or a policy this way. Console scripts do not
put the current directory on ``sys.path``, while the modules they name usually live there.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

__all__ = ["import_attribute"]


def import_attribute(module_name: str, attribute: str) -> Any:
    """``module_name.attribute``, the module imported with the current directory on the path.

    Raises :class:`ImportError` when the module cannot be imported and :class:`AttributeError`
    when it has no such attribute (or it is ``None``): callers word their own messages.
    """
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    module = importlib.import_module(module_name)
    found = getattr(module, attribute, None)
    if found is None:
        raise AttributeError(attribute)
    return found
