"""`/metrics` adds up the histograms of several origins bucket by bucket; one of another build, whose
buckets do not line up, is left out rather than added wrongly."""

from actors.frontdoor.metrics import added_up
from schemas.metrics import Histogram


def test_histograms_of_several_origins_add_up_bucket_by_bucket():
    a = Histogram([0.1, 1.0], [1, 2, 0], 1.5)
    b = Histogram([0.1, 1.0], [0, 1, 3], 9.0)
    other_build = Histogram([0.5], [7, 7], 100.0)
    assert added_up([a, b, other_build]) == Histogram([0.1, 1.0], [1, 3, 3], 10.5)
    assert added_up([]) is None
