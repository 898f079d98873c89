"""Which GPUs of a machine a job is booked on (issue 38): inside one NVLink domain where it
fits, the domain with the fewest free, so that whole domains stay whole."""

from __future__ import annotations

import pytest

from market.bookings import gpus_pick

# an 8-GPU machine in two NVLink domains of 4 (0-3 and 4-7), GPU 0 and GPU 1 taken
FREE = [(2, 0), (3, 0), (4, 4), (5, 4), (6, 4), (7, 4)]


def test_a_pair_goes_to_the_linked_pair_left_not_across_domains() -> None:
    assert gpus_pick(FREE, 2) == [2, 3]  # domain 0 has 2 free: best fit; domain 4 stays whole for a 4-GPU job
    assert gpus_pick(FREE, 4) == [4, 5, 6, 7]
    assert gpus_pick(FREE, 3) == [4, 5, 6]
    assert gpus_pick(FREE, 6) == [2, 3, 4, 5, 6, 7], "no domain holds 6: the lowest, across domains"


def test_one_gpu_goes_where_it_breaks_the_least() -> None:
    assert gpus_pick(FREE, 1) == [2]
    assert gpus_pick([(0, None), (1, 1), (2, 1)], 1) == [0], "a GPU outside every domain first"
    assert gpus_pick([(0, None), (1, None)], 2) == [0, 1], "a machine without NVLink: the lowest"
    with pytest.raises(ValueError, match="3 GPUs asked of 2 free"):
        gpus_pick([(0, None), (1, None)], 3)
