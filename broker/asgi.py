"""ASGI factory for multi-worker servers: `uvicorn --factory broker.asgi:build`."""

from starlette.applications import Starlette

from broker.app import create_app
from broker.runtime.gc_tuning import tune_for_server
from broker.runtime.settings import Settings


def build() -> Starlette:
    """A broker configured from the environment."""
    app = create_app(Settings.from_env())
    tune_for_server()
    return app
