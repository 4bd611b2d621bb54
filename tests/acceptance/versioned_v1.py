"""Version v1 of the payments app (see :mod:`tests.acceptance.versioned_app`)."""

from tests.acceptance.versioned_app import build

ai = build("v1")
