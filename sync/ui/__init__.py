"""The operator web page (``connector-sync ui``) and ``/metrics``.

Server-rendered (Starlette and Jinja2, served by uvicorn), with htmx, shipped in this package,
reloading the live parts; nothing is fetched from the internet. ``static/htmx.min.js`` is
htmx 2.0.11 (BSD Zero Clause), ``dist/htmx.min.js`` of the npm package ``htmx.org@2.0.11``
(``npm pack htmx.org@2.0.11``), sha256
d6fdc75f204e6bdefa99b69bf1e6d4ac69b8a364f77929f45c13476b4000f717. Pages call only the Python
API.
"""

from sync.ui.app import UiOptions, create_app
from sync.ui.server import serve

__all__ = ["UiOptions", "create_app", "serve"]
