"""Money as people read and type it: USDC, and prices in USDC per GPU-hour.

The chain and the API count the stablecoin's base units (6 decimals: 2_260_000 is
2.26 USDC); everything a person sees or types goes through here, so a page, a message
and an explanation write the same amount the same way ("2.26 USDC/GPU-h"). Plain Python:
the web's template filters, the services' messages and the tests import it. The engine
(market/engine/explain.py) may import nothing of ours and keeps a copy of ``figure``,
held equal to this one by tests/unit/web/test_money.py.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

DECIMALS = 6
TOKEN = 10**DECIMALS  # base units per USDC
PER_GPU_HOUR = "USDC/GPU-h"
PER_CU_HOUR = "USDC/CU-h"


def figure(amount: int) -> str:
    """Base units as a USDC number: thousands separated, 2 to 6 decimals, as many as it needs."""
    sign = "-" if amount < 0 else ""
    whole, frac = divmod(abs(int(amount)), TOKEN)
    digits = f"{frac:06d}".rstrip("0").ljust(2, "0")
    return f"{sign}{whole:,}.{digits}"


def usdc(amount: int) -> str:
    """An amount: ``12_500_000`` -> ``'12.50 USDC'``."""
    return f"{figure(amount)} USDC"


def price(per_gpu_hour: int) -> str:
    """A price: ``2_260_000`` -> ``'2.26 USDC/GPU-h'``."""
    return f"{figure(per_gpu_hour)} {PER_GPU_HOUR}"


def price_per_cu(per_gpu_hour: int, compute_units: float) -> str | None:
    """A price per compute-unit-hour, which compares GPUs of different speeds: four decimals,
    so neighbouring offers differ (2.26/3.96 CU and 2.28/3.96 CU are 0.5707 and 0.5758)."""
    if not compute_units:
        return None
    return f"{per_gpu_hour / compute_units / TOKEN:,.4f} {PER_CU_HOUR}"


def parse_usdc(text: str, *, what: str = "amount") -> int:
    """``'2.50'`` (or ``'2,50'``, ``'$2.50'``, ``'2.5 USDC'``) -> 2_500_000 base units.

    Raises ValueError with a message that says what was wrong and what to type."""
    raw = (text or "").strip()
    cleaned = raw.removeprefix("$").removesuffix(PER_GPU_HOUR).removesuffix("USDC").strip().replace(" ", "")
    if cleaned.count(",") == 1 and "." not in cleaned and len(cleaned.partition(",")[2]) != 3:
        cleaned = cleaned.replace(",", ".")  # a decimal comma ("2,50"), not a thousands one
    cleaned = cleaned.replace(",", "")
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        raise ValueError(f"The {what} {raw!r} is not a number of USDC: type it like 2.50.") from None
    if not value.is_finite() or value < 0:
        raise ValueError(f"The {what} {raw!r} must be 0 or more USDC, like 2.50.")
    if value >= 10**12:
        raise ValueError(f"The {what} {raw!r} is too large.")
    if value != value.quantize(Decimal(1).scaleb(-DECIMALS)):
        raise ValueError(f"The {what} {raw!r} has more than {DECIMALS} decimals: USDC counts to 0.000001.")
    return int(value * TOKEN)
