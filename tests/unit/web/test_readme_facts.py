"""Figures the README states about the running product match the code that sets them."""

from __future__ import annotations

from pathlib import Path

README = (Path(__file__).resolve().parents[3] / "README.md").read_text()


def test_the_demo_buyers_deposit_the_readme_names_is_the_one_they_get() -> None:
    """The README said 50,000 test USDC; the demo deposits 500,000 (issue 32)."""
    from demo.chain import BUYER_DEPOSIT, TOKEN

    assert f"buyers start with {BUYER_DEPOSIT // TOKEN:,} test USDC deposited" in " ".join(README.split())
