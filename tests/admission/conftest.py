"""Fixtures of the admission server's tests."""

from __future__ import annotations

import pytest
from flask import Flask
from flask.testing import FlaskClient


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    """A Flask test client of the module's `app` fixture (test_fuzz keeps a module-scoped one of its own)."""
    return app.test_client()
