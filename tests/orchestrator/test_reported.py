"""What a report says failed (`orchestrator.core.reported`), from real report shapes."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.control.intake import parse_payload
from orchestrator.core.models import Frame, Issue, IssueSource
from orchestrator.core.reported import ReportedFailure, reported_failure, traceback_in

ROOT = Path(__file__).resolve().parents[2]


def test_the_demo_sentry_event_names_its_exception_and_the_newest_frame_of_the_application() -> (
    None
):
    issue = parse_payload((ROOT / "demo" / "sentry_event.json").read_bytes())

    assert reported_failure(issue) == ReportedFailure(
        "ZeroDivisionError", "average_price_cents", "the Sentry event"
    )


def test_a_qualified_type_is_its_own_name_and_frames_outside_the_application_do_not_count() -> None:
    issue = Issue(
        source=IssueSource.SENTRY_EVENT,
        title="CartError",
        error_type="shopcart.errors.CartError",
        frames=[
            Frame(file="shopcart/cart.py", function="total", in_app=True),
            Frame(file="lib/python3.11/decimal.py", function="quantize"),
        ],
    )

    assert reported_failure(issue) == ReportedFailure("CartError", "total", "the Sentry event")


TOOLZ = """I use `interpose` to put separators between the parts of a message.

```python
>>> list(interpose(", ", []))
Traceback (most recent call last):
  File "<stdin>", line 1, in <module>
  File ".../toolz/itertoolz.py", line 527, in interpose
    next(inposed)
StopIteration
```

Instead the call raises a bare `StopIteration`.
"""

CHAINED = """Seen in production:

    Traceback (most recent call last):
      File "/srv/app/shop/cart.py", line 12, in total
        return sum(self.prices) / len(self.prices)
                                  ^^^^^^^^^^^^^^^^
    ZeroDivisionError: division by zero

    During handling of the above exception, another exception occurred:

    Traceback (most recent call last):
      File "/srv/app/shop/views.py", line 40, in checkout
        cart.total()
      File "/usr/lib/python3/site-packages/django/core/handlers.py", line 9, in inner
        raise
    shop.errors.CheckoutError: could not total the cart
"""


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (TOOLZ, ReportedFailure("StopIteration", "interpose", "the traceback in the report")),
        # the last traceback, indented as a code block; site-packages is not the application
        (CHAINED, ReportedFailure("CheckoutError", "checkout", "the traceback in the report")),
        (
            '> Traceback (most recent call last):\n>   File "a.py", line 1, in f\n'
            ">     g()\n> KeyError: 'x'\n",
            ReportedFailure("KeyError", "f", "the traceback in the report"),
        ),
        # a traceback with its frames cut (`...`) says where nothing was raised: no facts
        ("Traceback (most recent call last):\n  ...\nValueError: out of range\n", None),
        ("The total is wrong: 3 instead of 4.", None),
    ],
)
def test_a_traceback_quoted_in_a_report_is_read_for_its_last_exception(
    body: str, expected: ReportedFailure | None
) -> None:
    assert traceback_in(body) == expected
    issue = Issue(source=IssueSource.GITHUB, title="t", body=body)
    assert reported_failure(issue) == expected


def test_a_pull_request_reports_no_failure() -> None:
    issue = Issue(source=IssueSource.PULL_REQUEST, title="t", body=TOOLZ, error_type="TypeError")

    assert reported_failure(issue) is None


def test_a_report_names_the_types_its_words_hold_wherever_they_are() -> None:
    body = TOOLZ + "\nIn a generator it becomes `RuntimeError: generator raised StopIteration`."
    issue = Issue(source=IssueSource.GITHUB, title="interpose and tomli.TOMLDecodeError", body=body)
    sentry = Issue(
        source=IssueSource.SENTRY_EVENT, title="CartError: bad", error_type="shop.CartError",
        error_message="expected a PriceError",
    )  # fmt: skip

    found, event = reported_failure(issue), reported_failure(sentry)

    assert found is not None and event is not None
    for name in ("StopIteration", "RuntimeError", "TOMLDecodeError", "tomli.TOMLDecodeError"):
        assert found.names(name), name
    assert not found.names("ValueError") and not found.names("Runtime")
    assert event.names("PriceError") and event.names("CartError")
    assert not event.names("KeyError")
