"""The bulk histogram exposes exactly what a prometheus Histogram fed one value at a time does."""

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from service.metrics import BulkHistogram


def _buckets_and_sum(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("lengths_") and "_created" not in line]


def test_bulk_histogram_matches_prometheus_histogram():
    bounds = (8, 16, 32, 64)
    values = [[1, 8, 9, 16, 17], [64, 65, 1000], [], [8.0, 0, 32]]  # edges land in the bucket they bound
    one_by_one, bulk = CollectorRegistry(), CollectorRegistry()
    reference = Histogram("lengths", "doc", buckets=bounds, registry=one_by_one)
    ours = BulkHistogram("lengths", "doc", bounds, bulk)
    for request in values:
        for v in request:
            reference.observe(v)
        ours.observe_many(request)
    expected = _buckets_and_sum(generate_latest(one_by_one).decode())
    assert 'lengths_bucket{le="8.0"} 4.0' in expected and "lengths_count 11.0" in expected
    assert _buckets_and_sum(generate_latest(bulk).decode()) == expected
