"""The operator web page (``connector-sync ui``) and ``/metrics``.

Server-rendered (Starlette and Jinja2, served by uvicorn), with htmx, shipped in this package,
reloading the live parts; nothing is fetched from the internet. Pages call only the Python API.
"""

from sync.ui.app import UiOptions, create_app
from sync.ui.server import serve

__all__ = ["UiOptions", "create_app", "serve"]
