"""The date forms of a dated dataset (components/spec/datasets.py, ``date_forms``): ``{date}``, ``{date-N}``,
``{date:FMT}`` and ``{date-N:FMT}`` rendered as the day a schedule names, and every form tpupipe cannot read refused
by the spec's validation with a SpecError naming the field and the form, before anything is created."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from components.data import drops
from components.spec import SpecError, datasets
from components.spec.checks import validate
from components.workload import resolve

WHEN = datetime(2026, 3, 1, 5, 30, tzinfo=UTC)  # the day after a non-leap February's last


@pytest.mark.parametrize(
    ("template", "rendered"),
    [
        ("gs://acme-sft/drops/{date}/", "gs://acme-sft/drops/2026-03-01/"),
        ("gs://acme-sft/drops/{date-1}/", "gs://acme-sft/drops/2026-02-28/"),
        ("gs://acme-sft/drops/dt={date-366}/", "gs://acme-sft/drops/dt=2025-02-28/"),
        ("gs://acme-sft/drops/{date:%Y%m%d}/", "gs://acme-sft/drops/20260301/"),
        ("gs://acme-sft/drops/{date-1:%Y/%m/%d}/*.jsonl", "gs://acme-sft/drops/2026/02/28/*.jsonl"),
        ("bq://p.d.events_{date:%Y%m%d}", "bq://p.d.events_20260301"),
        ("bq://p.d.events_{date-7:%Y%m%d}", "bq://p.d.events_20260222"),
        ("bq://p.d.events_{date}", "bq://p.d.events_2026-03-01"),
        ("/data/{date:%y-%j}/{date:%G-W%V-%u}.jsonl", "/data/26-060/2026-W09-7.jsonl"),
        ("/data/{date:%a %A %b %B %U %W %w 100%%}.jsonl", "/data/Sun Sunday Mar March 09 08 0 100%.jsonl"),
        ("gs://acme-sft/no-date/", "gs://acme-sft/no-date/"),
    ],
)
def test_each_form_renders_the_day_it_names(template, rendered):
    assert datasets.render(template, WHEN) == rendered
    assert datasets.dated(template) == (template != "gs://acme-sft/no-date/")


def test_the_day_is_the_schedules_utc_day():
    """A time given in another zone is the UTC day's: 23:30 on 1 March in UTC-5 is 2 March in UTC."""
    late = datetime(2026, 3, 1, 23, 30, tzinfo=timezone(timedelta(hours=-5)))
    assert datasets.render("{date}/{date-1:%d}", late) == "2026-03-02/01"


def test_the_stable_prefix_ends_before_the_first_form_of_any_kind():
    assert drops.dated_parent("gs://acme-sft/drops/{date:%Y/%m/%d}/") == "gs://acme-sft/drops/"
    assert drops.dated_parent("gs://acme-sft/drops/day={date-1}/lang=en/") == "gs://acme-sft/drops/"
    assert drops.dated_parent("/data/sft/{date:%Y%m%d}.jsonl") == "/data/sft/"
    assert drops.dated_parent("gs://acme-sft/drops/latest/") == ""
    assert datasets.first_date("gs://acme-sft/{date-2:%Y}/{date}") == len("gs://acme-sft/")


@pytest.mark.parametrize(
    ("dataset", "said"),
    [
        ("gs://acme-sft/{day}/", "unknown placeholder {day}: the placeholders are date forms"),
        ("gs://acme-sft/{date+1}/", "unknown placeholder {date+1}"),
        ("gs://acme-sft/{date-}/", "unknown placeholder {date-}"),
        ("gs://acme-sft/{date-0}/", "{date-0}: N in {date-N} is a number of days from 1 to 366"),
        ("gs://acme-sft/{date-367}/", "{date-367}: N in {date-N} is a number of days from 1 to 366"),
        ("gs://acme-sft/{date:}/", "{date:}: no format after ':'"),
        ("gs://acme-sft/{date:%Y%m%d%H}/", "{date:%Y%m%d%H}: %H is not a date directive"),
        ("gs://acme-sft/{date-1:%Y-%m-%dT%M}/", "%M is not a date directive"),
        ("gs://acme-sft/{date:%S}/", "%S is not a date directive"),
        ("gs://acme-sft/{date:%f}/", "%f is not a date directive"),
        ("gs://acme-sft/{date:%p}/", "%p is not a date directive"),
        ("gs://acme-sft/{date:%z}/", "%z is not a date directive"),
        ("gs://acme-sft/{date:%Z}/", "%Z is not a date directive"),
        ("gs://acme-sft/{date:%I}/", "%I is not a date directive"),
        ("gs://acme-sft/{date:%c}/", "%c is not a date directive"),
        ("gs://acme-sft/{date:%x}/", "%x is not a date directive"),
        ("gs://acme-sft/{date:%X}/", "%X is not a date directive"),
        ("gs://acme-sft/{date:%-d}/", "%- is not a date directive"),
        ("gs://acme-sft/{date:%Y%}/", "{date:%Y%}: a lone '%' ends the format"),
        ("bq://p.d.events_{date:%Y/%m/%d}", "{date:%Y/%m/%d}: '/' may not be in a BigQuery table name"),
        ("bq://p.d.events_{date:%Y.%m}", "{date:%Y.%m}: '.' may not be in a BigQuery table name"),
        ("bq://p.d.events_{date:%Y%%}", "'%' may not be in a BigQuery table name"),
        ("bq://p.d_{date:%Y}.events", "a dated BigQuery source is a dated table, the date form in the table's name"),
    ],
)
def test_a_bad_form_is_refused_naming_the_field_and_the_form(dataset, said):
    for key in ("train.dataset", "train.eval_dataset"):
        other = "train.dataset=gs://acme-sft/train/" if key == "train.eval_dataset" else ""
        with pytest.raises(SpecError) as raised:
            validate(resolve("local-fsdp", f"{other} {key}={dataset}"))
        assert raised.value.field == key
        assert said in str(raised.value), str(raised.value)


def test_a_format_a_table_name_refuses_is_read_in_paths():
    """``/`` is a directory in Cloud Storage and on disk, and no character of a BigQuery table name."""
    for dataset in ("gs://acme-sft/drops/{date:%Y/%m/%d}/", "/data/sft/{date-1:%Y/%m/%d}/"):
        validate(resolve("local-fsdp", f"train.dataset={dataset}"))
    validate(resolve("local-fsdp", "train.dataset=bq://p.d.events_{date-1:%Y%m%d}"))


def test_names_are_the_c_locales_english_for_every_day_and_month():
    """``%a %A %b %B`` are rendered from fixed English names (the C locale's), not by strftime's LC_TIME."""
    days = [datetime(2026, 3, 2, tzinfo=UTC) + timedelta(days=n) for n in range(7)]  # a Monday, then the week
    assert [datasets.render("{date:%A %a}", day) for day in days] == [
        "Monday Mon", "Tuesday Tue", "Wednesday Wed", "Thursday Thu", "Friday Fri", "Saturday Sat", "Sunday Sun",
    ]  # fmt: skip
    months = [datetime(2026, month, 15, tzinfo=UTC) for month in range(1, 13)]
    assert [datasets.render("{date:%b}", month) for month in months] == [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ]  # fmt: skip
    assert datasets.render("{date-1:%B %d, %Y (%%b)}", WHEN) == "February 28, 2026 (%b)"


def test_names_do_not_follow_the_process_locale():
    """A library that calls setlocale (matplotlib does) does not move a dataset's path: with LC_TIME German or
    French, ``{date:%A %B}`` is still English. Needs one such locale installed on the machine."""
    import locale

    before = locale.setlocale(locale.LC_TIME)
    for name in ("de_DE.UTF-8", "de_DE.utf8", "fr_FR.UTF-8", "fr_FR.utf8", "es_ES.UTF-8"):
        try:
            locale.setlocale(locale.LC_TIME, name)
        except locale.Error:
            continue
        try:
            assert WHEN.strftime("%A %B") != "Sunday March"  # the locale does rename them
            assert datasets.render("gs://b/{date:%A-%B}/", WHEN) == "gs://b/Sunday-March/"
        finally:
            locale.setlocale(locale.LC_TIME, before)
        return
    pytest.skip("no German, French or Spanish locale installed (locale -a)")


def test_a_fixed_evaluation_set_with_a_date_form_is_refused_naming_the_field():
    """A fixed evaluation set is the one yardstick of every run: a dated one would be another set each day, which the
    evaluate stage refuses against the champion's on every run after the first."""
    for dataset in ("gs://acme-sft/eval/{date}/", "bq://p.d.eval_{date-1:%Y%m%d}", "/data/eval-{date:%Y%m}.jsonl"):
        with pytest.raises(SpecError, match="a fixed evaluation set is the same examples on every run") as raised:
            validate(resolve("local-fsdp", f"train.dataset=gs://acme-sft/train/ train.eval_dataset={dataset}"))
        assert raised.value.field == "train.eval_dataset"


def test_a_table_of_the_schedules_own_day_earns_a_warning_line(capsys):
    """``events_{date:%Y%m%d}`` is today's table (UTC), which its writer is likely still filling when a daily schedule
    reads it: `tpupipe validate` says so in one warning line and goes on; ``{date-1:...}`` and dated paths do not."""
    from pipelines.cli.main import main

    today = "bq://p.d.events_{date:%Y%m%d}"
    said = datasets.same_day_table(today)
    assert said.startswith(f"train.dataset {today} is the table of the schedule's own day (UTC)")
    assert "{date-1:...} reads the day before's" in said
    for other in ("bq://p.d.events_{date-1:%Y%m%d}", "bq://p.d.events", "gs://acme-sft/drops/{date}/"):
        assert datasets.same_day_table(other) == ""
    assert main(["validate", "local-fsdp", "--set", f"train.dataset={today}"]) == 0
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == f"tpupipe: warning: {said}"
    assert main(["validate", "local-fsdp", "--set", "train.dataset=bq://p.d.events_{date-1:%Y%m%d}"]) == 0
    assert capsys.readouterr().err == ""
