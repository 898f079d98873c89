"""GridBid: an open marketplace for GPU compute."""

# Every server process (CLI, ASGI, WSGI, Celery, manage) starts here: py-ecc, loaded
# by web3 and by our BLS code, raises the recursion limit so far that a deeply nested
# JSON body crashes the process instead of raising; contracts.pyecc puts it back.
from contracts import pyecc as _pyecc  # noqa: F401
