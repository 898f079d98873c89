"""Issue 29, deliverable 6: the engine against an exact lexicographic MILP on seeded rounds
of every instance family (tests/bench/instances.py FAMILIES).

For each round: every trade is feasible by the MILP's own reading of the hard constraints
(exact_milp.py, written from the engine's documentation, none of its solver code); each
class's surplus is at least 0.995 of the lexicographic optimum (reserved, then on-demand,
then spot); and each class's reported upper bound is at or above the exact optimum of that
class on the capacity the engine's classes above it left (what the bound claims to bound;
for the reserved class, the lexicographic optimum itself). A class the engine calls exact
reports its own surplus as its bound, so "exact" must be exact. A round's quality is its
worst class's surplus over that class's lexicographic optimum; a class may pass its optimum
where a class above fell short of its own. At the limits (scores spanning twelve digits)
floating point cannot always hold a class above at its optimum while the MILP solves the
next; such classes are left out of the quality figure (exact_milp.lexicographic says which).

The rounds where the engine misses today are marked xfail(strict=True) with the figure
measured, so the suite stays green, the gap stays recorded, and a fix that closes one makes
its mark fail until it is removed (a mark that only says the MILP ran out of time is not
strict: that depends on the box). The default run clears the rounds of up to 60 orders a
side; GRIDBID_ENGINE_SWEEP=1 adds the rest (80 to 300 a side; minutes: `make bench` prints the
same comparison per family and size band).
"""

from __future__ import annotations

import os

import pytest

from market.engine import RoundInput, limits
from market.engine.validate import validate
from tests.bench.instances import FAMILIES
from tests.unit.engine.exact_milp import check_round

TARGET = 0.995
SIZES = (20, 30, 40, 60, 80, 100, 150, 200, 300)  # orders a side, by seed
SEEDS = 19  # per family: 11 families x 19 = 209 rounds
DEFAULT_MAX = 60  # orders a side in the default run
SWEEP = os.environ.get("GRIDBID_ENGINE_SWEEP") == "1"


def rounds() -> list[tuple[str, int, int]]:
    """Every (family, seed, orders a side) of the sweep, smallest first."""
    out = [(fam, seed, SIZES[seed % len(SIZES)]) for fam in FAMILIES for seed in range(SEEDS)]
    return sorted(out, key=lambda r: (r[2], r[0], r[1]))


# (family, seed, orders a side) -> what was measured on it (engine 1.5.0, exact_milp.py, this
# 2-core box). Every default round (20-60 a side) reaches 0.995 since the exact path (27 did not
# with 1.3.0). Of the 110 rounds of 80-300 a side, 1.4.0 left 13 short, all on the LP path; 1.5.0
# counts a round's feasible pairs (most 300-a-side rounds are small now) and clears a class by
# its own MIP where the round is too big for one model. Those left are multi-machine and ties
# rounds where one class is still too big for a MIP (its LP path short of the optimum), or the
# classes above, each exact on what it was left, broke a tie against the classes below. The
# MILP's time limit only matters to the rounds over 60 a side (GRIDBID_ENGINE_SWEEP=1); where it
# is all that is marked, the mark is not strict: whether HiGHS proves it within 30 s depends on
# the box.
KNOWN_SHORT: dict[tuple[str, int, int], str] = {
    ("multi_machine", 7, 200): "quality below 0.995 on multi_machine; measured 0.8654 on spot, 0.9968 on on_demand (mip-per-class); the exact MILP did not prove its optimum within 30 s a class on this box",
    ("multi_machine", 16, 200): "quality below 0.995 on multi_machine; measured 0.9935 on on_demand (mip-per-class, its MIP at the work limit)",
    ("multi_machine", 8, 300): "the exact MILP did not prove its optimum within 30 s a class on this box",
    ("multi_machine", 17, 300): "quality below 0.995 on multi_machine; measured 0.9788 on on_demand (17,258 columns: LP path); the exact MILP did not prove its optimum within 30 s a class on this box",
    ("ties", 8, 300): "quality below 0.995 on ties; measured 0.9905 on on_demand, 0.9606 on spot (mip-per-class: the reserved class's ties, each exact on what it was left)",
}


def _param(fam: str, seed: int, n: int) -> object:
    marks: list[pytest.MarkDecorator] = []
    if n > DEFAULT_MAX:
        marks += [pytest.mark.slow, pytest.mark.skipif(not SWEEP, reason="GRIDBID_ENGINE_SWEEP=1 runs the rounds over 60 a side")]
    why = KNOWN_SHORT.get((fam, seed, n))
    if why is not None:
        strict = not why.startswith("the exact MILP did not prove")
        marks.append(pytest.mark.xfail(strict=strict, reason=f"issue 29: {why}"))
    return pytest.param(fam, seed, n, marks=marks, id=f"{fam}-{seed}-{n}")


@pytest.mark.parametrize(("family", "seed", "n"), [_param(*r) for r in rounds()])
def test_round_reaches_the_lexicographic_optimum_under_its_reported_bound(family: str, seed: int, n: int) -> None:
    inp: RoundInput = FAMILIES[family](seed, n)
    c = check_round(family, seed, n, inp)
    assert not c.infeasible, f"trades the exact model calls infeasible: {c.infeasible[:5]}"
    # the engine's reserved surplus cannot beat the reserved optimum: if it does, the model is
    # wrong (HiGHS holds the optimum to about 1e-6 where scores span 12 digits, at the limits)
    assert c.engine[0] <= c.optimum[0] * (1 + 1e-5) + 64 * c.unit, (c.engine, c.optimum)
    problems = c.bound_short()
    if c.quality < TARGET:
        problems.append(f"quality {c.quality:.4f} < {TARGET} on {c.worst} (engine {c.engine}, optimum {c.optimum})")
    # the MILP's solutions are feasible, proven optimal or not: a shortfall against one is real
    assert not problems, f"{c.method}: " + "; ".join(problems)
    assert c.proven, "the exact MILP hit its time limit: a pass against it proves nothing"


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_makes_valid_deterministic_rounds(family: str) -> None:
    make = FAMILIES[family]
    for n in (20, 300):
        a, b = make(3, n), make(3, n)
        validate(a)
        assert a == b, "the same seed must make the same round"
        assert len(a.offers) >= n // 2 and len(a.bids) == n
    assert make(3, 40) != make(4, 40), "another seed must make another round"


def test_families_stress_what_they_are_named_for() -> None:
    spot, reserved = FAMILIES["all_spot"](1, 60), FAMILIES["all_reserved"](1, 60)
    assert {b.klass for b in spot.bids} == {"spot"} and any(not o.spot_allowed for o in spot.offers)
    assert {b.klass for b in reserved.bids} == {"reserved"} and any(o.reserved_only for o in reserved.offers)
    assert FAMILIES["fair_share"](1, 60).config.fair_share_cap < 1.0
    huge = FAMILIES["one_huge_bid"](1, 60)
    assert max(b.gpus for b in huge.bids) * 4 >= sum(o.gpus for o in huge.offers if o.gpu_model == huge.bids[0].gpu_models[0])
    edge = FAMILIES["at_limits"](1, 60)
    assert any(b.max_price == limits.MAX_PRICE for b in edge.bids)
    assert any(o.gpus == limits.MAX_GPUS for o in edge.offers)
    assert any(b.duration_s == limits.MAX_DURATION_S for b in edge.bids)
    assert any(b.weights.reliability == limits.MAX_WEIGHT for b in edge.bids)
    ties = FAMILIES["ties"](1, 60)
    assert len({o.ask for o in ties.offers}) <= 10
    multi = FAMILIES["multi_machine"](1, 60)
    assert sum(not b.same_machine for b in multi.bids) > len(multi.bids) // 2
