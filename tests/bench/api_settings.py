"""Settings for the servers bench_api.py starts: the real settings, with the API throttle's
rates raised so that one benchmarking client on 127.0.0.1 is not answered 429.

The throttle classes stay in place, so their cost (a cache read and write per request:
locmem embedded, Redis in production) is still measured; only the allowance changes. It
is counted per second, not per minute: the throttle keeps the time of each request in
its window, and a one-minute window at 300 requests a second is a list of 18,000 that
one client makes it read and write on every request - far more than any real client's.
"""

from gridbid.settings import *  # noqa: F403
from gridbid.settings import REST_FRAMEWORK

REST_FRAMEWORK = {**REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {**REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"], "anon": "10000/second", "user": "10000/second"}}
