"""ASGI factory for multi-worker servers: `uvicorn --factory broker.asgi:build`."""

from starlette.applications import Starlette

from broker.app import create_app
from broker.settings import Settings


def build() -> Starlette:
    """A broker configured from the environment."""
    return create_app(Settings.from_env())
