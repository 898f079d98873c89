"""Settings for the servers bench_api.py starts: the real settings, with the API throttle's
rates raised so that one benchmarking client on 127.0.0.1 is not answered 429.

The throttle classes stay in place, so their cost (a cache read and write per request:
locmem embedded, Redis in production) is still measured; only the allowance changes.
"""

from gridbid.settings import *  # noqa: F403
from gridbid.settings import REST_FRAMEWORK

REST_FRAMEWORK = {**REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"anon": "1000000/minute", "user": "1000000/minute"}}
