"""Span records in a traced request's list (tpu_worker/spans.py): a span runs from the latest
stamp it names to now, nothing is recorded for an untraced request or a missing stamp."""

from tpu_worker.spans import span, span_since, stamp


def test_span_since_starts_at_the_latest_stamp_and_ends_now():
    trace: list = [["w.queued", 10]]
    stamp(trace, "w.taken", 20)
    stamp(trace, "w.taken", 30)
    span_since(trace, "queue", "w.taken", batched_with=2)
    name, start, end, attrs = trace[-1]
    assert (name, start, attrs) == ("queue", 30, {"batched_with": 2})
    assert end >= start


def test_spans_are_not_stamps_and_nothing_is_recorded_untraced():
    trace: list = []
    span(trace, "compile", 5, 9)
    span_since(trace, "decode", "compile")  # a span is no stamp to start from
    assert trace == [["compile", 5, 9]]
    span_since(None, "queue", "w.queued")
    stamp(None, "w.taken")
