"""The GridBid provider agent: `gridbid-agent`.

It runs on providers' machines, outside our servers, so it is installable
without Django (`pip install 'gridbid[agent]'`) and imports nothing of ours but
`contracts` (BLS, Merkle) and the pure-Python catalogue in `providers.catalogue`.
Keep this module light: the CLI imports heavy things inside its commands.
"""

__version__ = "0.1.0"
