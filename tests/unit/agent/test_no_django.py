"""The agent installs and runs without Django: importing all of it must never load Django."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

BLOCKER = r"""
import importlib.abc, pkgutil, sys

class NoDjango(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "django" or name.startswith(("django.", "rest_framework")):
            raise ImportError(f"the agent imported {name}")
        return None

sys.meta_path.insert(0, NoDjango())
import providers.agent
mods = [m.name for m in pkgutil.walk_packages(providers.agent.__path__, "providers.agent.") if not m.name.endswith("__main__")]
for name in mods:
    __import__(name)
from providers.agent.cli import main
for cmd in list(main.commands):
    main.get_command(None, cmd)
assert not any(m == "django" or m.startswith("django.") for m in sys.modules), "django was loaded"
print("imported", len(mods), "modules")
"""


def test_the_whole_agent_imports_with_django_unimportable():
    r = subprocess.run([sys.executable, "-c", BLOCKER], cwd=ROOT, capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    assert "imported" in r.stdout
