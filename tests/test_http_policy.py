"""Property tests: Retry-After parsing and response classification are total and sane."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

from hypothesis import given
from hypothesis import strategies as st

from connectors.http_policy import (
    MAX_RETRY_AFTER,
    Verdict,
    classify,
    parse_reset_epoch,
    parse_retry_after,
)

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


@given(st.integers(min_value=0, max_value=int(MAX_RETRY_AFTER)))
def test_delta_seconds_are_taken_as_given(seconds: int) -> None:
    assert parse_retry_after(str(seconds), NOW) == seconds
    assert parse_retry_after(f"  {seconds} ", NOW) == seconds


@given(st.integers(min_value=0, max_value=int(MAX_RETRY_AFTER)))
def test_an_http_date_is_seconds_from_now(seconds: int) -> None:
    when = format_datetime(NOW + timedelta(seconds=seconds), usegmt=True)
    assert parse_retry_after(when, NOW) == seconds


@given(st.integers(min_value=1, max_value=10**6))
def test_a_date_in_the_past_means_now(seconds: int) -> None:
    when = format_datetime(NOW - timedelta(seconds=seconds), usegmt=True)
    assert parse_retry_after(when, NOW) == 0


@given(
    st.one_of(
        st.integers(max_value=-1).map(str),
        st.integers(min_value=int(MAX_RETRY_AFTER) + 1).map(str),
        st.text().filter(lambda t: not t.strip().lstrip("+-").replace(".", "", 1).isdigit()),
        st.sampled_from(["nan", "inf", "-0.5", "1e9", "Wed, 99 Foo 2026 99:99:99 GMT", ""]),
    )
)
def test_nonsense_is_none_never_an_exception(value: str) -> None:
    result = parse_retry_after(value, NOW)
    assert result is None or 0 <= result <= MAX_RETRY_AFTER


@given(st.floats(allow_nan=True, allow_infinity=True).map(str) | st.text())
def test_a_reset_epoch_is_bounded(value: str) -> None:
    result = parse_reset_epoch(value, NOW)
    assert result is None or 0 <= result <= MAX_RETRY_AFTER


@given(
    status=st.integers(min_value=100, max_value=599),
    refreshed=st.booleans(),
    retry_after=st.one_of(st.none(), st.integers(0, 100).map(str), st.just("garbage")),
)
def test_every_status_gets_one_verdict(
    status: int, refreshed: bool, retry_after: str | None
) -> None:
    headers = {} if retry_after is None else {"retry-after": retry_after}
    verdict = classify(status, headers, NOW, refreshed=refreshed).verdict
    if 200 <= status < 300:
        assert verdict is Verdict.OK
    elif status == 429 or (status == 503 and retry_after is not None):
        assert verdict is Verdict.RATE_LIMITED
    elif status in (502, 503, 504):
        assert verdict is Verdict.TRANSIENT
    elif status >= 500:
        assert verdict is Verdict.RETRYABLE
    elif status == 401:
        assert verdict is (Verdict.AUTH if refreshed else Verdict.REFRESH)
    else:
        assert verdict is Verdict.PERMANENT


def test_retry_after_on_a_429_is_honoured_and_nonsense_is_flagged() -> None:
    good = classify(429, {"retry-after": "120"}, NOW, refreshed=False)
    assert (good.verdict, good.wait, good.nonsense_retry_after) == (
        Verdict.RATE_LIMITED,
        120,
        False,
    )
    bad = classify(429, {"retry-after": "-5"}, NOW, refreshed=False)
    assert (bad.verdict, bad.wait, bad.nonsense_retry_after) == (Verdict.RATE_LIMITED, None, True)
