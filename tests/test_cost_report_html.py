"""Issue 10: the cost report's self-contained HTML page.

Unit tests read the rendered text (escaping, no network reference, every chart or its "no
data", formatted figures, the edge cases). The browser tests open the page in Debian's
headless Chromium (tests/headless_chromium.py: the DevTools protocol on a pipe) and check what
a reader sees: every chart drawn with marks, no console error or exception, no request but the
file itself, nothing wider than 1280 px. The full-page screenshot is kept under
.pytest_cache/d/cost_report_html/ (its path is printed).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from cost_report.display import (
    fmt_bytes,
    fmt_bytes_short,
    fmt_count,
    fmt_pct,
    fmt_period,
    fmt_usd,
    fmt_usd_short,
)
from cost_report.html_report import CHART_NAMES, TOP_ROWS, render_html, top_rows
from cost_report.model import ReportModel
from cost_report.svg_charts import nice_ticks
from tests.cost_report_samples import (
    HOSTILE_FILE,
    HOSTILE_ZONE,
    SCRIPT_TOPIC,
    empty_model,
    hostile_model,
    sample_model,
    zero_cost_model,
)
from tests.headless_chromium import Chromium, ChromiumUnavailable, launch, open_page

WIDTH = 1280


class Charts(HTMLParser):
    """Each `svg.chart` of a page: its title, its marks and whether it says "no data"; and
    every attribute that could fetch something."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.charts: dict[str, dict[str, Any]] = {}
        self.fetching: list[tuple[str, str, str]] = []
        self.tags: set[str] = set()
        self._current: dict[str, Any] | None = None
        self._depth = 0
        self._in_title = self._in_no_data = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.add(tag)
        for name in ("src", "href", "xlink:href", "srcset", "action", "poster", "data"):
            if name in a:
                self.fetching.append((tag, name, a[name] or ""))
        if tag == "svg" and "chart" in (a.get("class") or "").split():
            self._current = {"title": "", "marks": 0, "no_data": False}
            self.charts[a.get("data-chart") or "?"] = self._current
            self._depth = 0
        if self._current is None:
            return
        if tag == "svg":
            self._depth += 1
        if "mark" in (a.get("class") or "").split():
            self._current["marks"] += 1
        self._in_title = tag == "title" and self._depth == 1 and not self._current["title"]
        self._in_no_data = "no-data" in (a.get("class") or "").split()

    def handle_endtag(self, tag: str) -> None:
        if self._current is not None and tag == "svg":
            self._depth -= 1
            if self._depth == 0:
                self._current = None
        self._in_title = self._in_no_data = False

    def handle_data(self, data: str) -> None:
        if self._current is None:
            return
        if self._in_title:
            self._current["title"] += data
        if self._in_no_data and data.strip() == "no data":
            self._current["no_data"] = True


def charts_of(page: str) -> Charts:
    parser = Charts()
    parser.feed(page)
    parser.close()
    return parser


# -- units -------------------------------------------------------------------------------------


def test_units_are_human_friendly() -> None:
    assert fmt_bytes(0) == "0 B"
    assert fmt_bytes(999) == "999 B"
    assert fmt_bytes(1_500_000_000) == "1.50 GB"
    assert fmt_bytes(38.2e12) == "38.2 TB"
    assert fmt_bytes(512e15) == "512 PB"
    assert fmt_bytes(10**40).endswith(" EB")
    assert fmt_usd(1451.104) == "$1,451.10"
    assert fmt_usd(0) == "$0.00"
    assert fmt_usd(0.004) == "<$0.01"
    assert fmt_usd(-12.5) == "-$12.50"
    assert fmt_usd(1.2e12) == "$1,200,000,000,000.00"
    assert fmt_pct(0.869) == "86.9%"
    assert fmt_count(73_200_000) == "73,200,000"
    assert fmt_usd_short(1500) == "$1.5k" and fmt_usd_short(250) == "$250"
    assert fmt_bytes_short(0) == "0" and fmt_bytes_short(50e9) == "50 GB"
    for bad in (None, float("nan"), float("inf"), "12", True):
        assert fmt_usd(bad) == fmt_bytes(bad) == fmt_pct(bad) == "n/a"
    assert fmt_period("2026-11-01", "2026-11-30") == "1\u201330 Nov 2026"
    assert fmt_period("2026-12-30", "2027-01-02") == "30 Dec 2026 \u2013 2 Jan 2027"
    assert fmt_period("2026-11-01", "2026-11-01") == "1 Nov 2026"


@pytest.mark.parametrize("peak", [0.0, 1e-9, 0.37, 437.0, 1e15, float("nan")])
def test_axis_ticks_are_round_and_cover_the_peak(peak: float) -> None:
    ticks = nice_ticks(peak)
    assert ticks[0] == 0 and ticks == sorted(ticks) and 3 <= len(ticks) <= 11
    assert ticks[-1] >= (peak if peak == peak else 1) * (1 - 1e-9)


def test_top_rows_sum_the_rest_as_other() -> None:
    rows = [
        {"topic": f"t{i}", "usd": 100 - i, "bytes": 10, "cross_zone_bytes": 1} for i in range(100)
    ]
    top = top_rows(rows, "topic")
    assert len(top) == TOP_ROWS
    assert [r.label for r in top[:-1]] == [f"t{i}" for i in range(TOP_ROWS - 1)]
    other = top[-1]
    assert other.label == f"(other: {100 - TOP_ROWS + 1} rows)"
    assert other.usd == sum(100 - i for i in range(TOP_ROWS - 1, 100))
    assert other.bytes == 10 * (100 - TOP_ROWS + 1)
    # the job's own "(other ...)" row joins the rest instead of taking a bar of its own
    job = [*rows[:10], {"topic": "(other topics and no topic)", "usd": 1, "bytes": 5}]
    assert [r.label for r in top_rows(job, "topic")][-1] == "(other topics and no topic)"


# -- the page as text --------------------------------------------------------------------------


def test_full_model_has_every_chart_with_marks_and_a_title() -> None:
    charts = charts_of(render_html(sample_model())).charts
    assert set(charts) == set(CHART_NAMES)
    for name, chart in charts.items():
        assert chart["title"].strip(), name
        assert chart["marks"] > 0 and not chart["no_data"], name


def test_empty_model_says_no_data_in_every_chart() -> None:
    page = render_html(empty_model())
    charts = charts_of(page).charts
    assert set(charts) == set(CHART_NAMES)
    for name, chart in charts.items():
        assert chart["no_data"] and chart["marks"] == 0 and chart["title"].strip(), name
    assert "No input was rejected." in page and "No warnings." in page
    assert "$0.00" in page and "n/a" in page


def test_page_references_nothing_on_the_network() -> None:
    for model in (sample_model(), hostile_model(), empty_model()):
        page = render_html(model)
        parsed = charts_of(page)
        assert parsed.fetching == []
        assert not {"script", "link", "img", "iframe", "object", "embed"} & parsed.tags
        lowered = page.lower()
        for needle in ("http://", "https://", "//cdn", "url(", "@import", "@font-face"):
            assert needle not in lowered
        assert "content-security-policy" in lowered and "default-src 'none'" in page


def test_strings_from_data_are_escaped() -> None:
    page = render_html(hostile_model())
    assert "<script" not in page.lower() and "<img" not in page.lower() and "<b>" not in page
    assert "&lt;script&gt;alert(&quot;topic&quot;)&lt;/script&gt;" in page
    assert "&quot;&gt;&lt;img src=x onerror=alert(1)&gt;" in page
    assert "accounting/&lt;/td&gt;&lt;script&gt;alert(&#x27;file&#x27;)" in page
    # every table still has as many cells per row as headers: nothing broke out of a cell
    for table in re.findall(r"<table.*?</table>", page, re.S):
        heads = len(re.findall(r"<th\b", table))
        for row in re.findall(r"<tbody>.*?</tbody>", table, re.S)[0].split("</tr>")[:-1]:
            assert len(re.findall(r"<td\b", row)) == heads
    assert SCRIPT_TOPIC and HOSTILE_ZONE and HOSTILE_FILE


def test_figures_appear_formatted() -> None:
    model = sample_model()
    page = render_html(model)
    t = model.totals
    for figure in (
        fmt_usd(t["zonefleet_usd"]),
        fmt_usd(t["counterfactual_usd"]["kafka_rf3"]),
        fmt_usd(t["counterfactual_usd"]["kafka_rf3_fetch_from_follower"]),
        fmt_usd(t["savings_usd"]["kafka_rf3"]),
        fmt_pct(t["savings_fraction"]["kafka_rf3"]),
        fmt_pct(t["savings_fraction"]["kafka_rf3_fetch_from_follower"]),
        fmt_bytes(t["cross_zone_bytes"]),
        fmt_pct(t["cross_zone_share_of_payload"], 2),
        fmt_usd(model.shared_fs["regional_usd"]),
        fmt_usd(model.shared_fs["preferred_az_usd"]),
        "1\u201330 Nov 2026",
        "01 Nov",
        "0.0004",  # every price, as given
        "30.4375",
    ):
        assert figure in page, figure
    assert re.search(r"\$\d{1,3}(,\d{3})*\.\d\d", page)
    for warning in model.warnings:
        assert warning.replace("'", "&#x27;") in page
    assert 'class="warnings"' in page
    assert page.index('class="warnings"') < page.index('data-chart="daily_cost"')


def test_edge_cases_render() -> None:
    # one day, 100 topics, names of 300 characters, huge figures, sources not given
    page = render_html(hostile_model())
    charts = charts_of(page).charts
    assert all(c["marks"] > 0 for c in charts.values())
    topics_svg = re.search(r'data-chart="top_topics".*?</svg>', page, re.S)
    assert topics_svg is not None
    assert "(other: 89 rows)" in topics_svg[0]
    # cut short on the bar's label, whole in its tooltip and in the table
    assert re.search(r">x{20,}\u2026</text>", topics_svg[0])
    assert f">{'x' * 300}</text>" not in topics_svg[0]
    assert f"<title>{'x' * 300}</title>" in topics_svg[0]
    assert f'<td class="text">{"x" * 300}</td>' in page
    assert "flow logs: not given" in page and "CUR: not given" in page
    assert "PB" in page or "EB" in page
    # a zero bill: no division by zero, fractions of nothing are n/a
    zero = render_html(zero_cost_model())
    assert set(charts_of(zero).charts) == set(CHART_NAMES) and "n/a" in zero
    # 400 days: the axis labels thin out instead of piling up
    long = sample_model(n_days=400)
    daily = re.search(r'data-chart="daily_cost".*?</svg>', render_html(long), re.S)
    assert daily is not None
    labels = re.findall(
        r'font-size="11" fill="#6b7280" text-anchor="middle">(\d\d \w\w\w)<', daily[0]
    )
    assert 10 <= len(labels) <= 25
    # a model without any optional part
    bare = render_html(ReportModel("2026-01-01", "2026-01-01", {}, {}))
    assert len(charts_of(bare).charts) == len(CHART_NAMES)


def test_a_dearer_zonefleet_is_shown_as_such() -> None:
    model = sample_model(n_days=2)
    t = model.totals
    t["savings_usd"] = {"kafka_rf3": -26.72, "kafka_rf3_fetch_from_follower": -26.76}
    t["savings_fraction"] = {"kafka_rf3": -111.6, "kafka_rf3_fetch_from_follower": -133.8}
    page = render_html(model)
    assert 'class="tile savings negative"' in page and "-$26.72" in page
    assert "zonefleet costs $26.72 more" in page and "113x Kafka&#x27;s at this traffic" in page
    t["savings_fraction"] = {"kafka_rf3": -0.5, "kafka_rf3_fetch_from_follower": -0.6}
    assert "50.0% above Kafka" in render_html(model)


def test_json_model_renders_the_same() -> None:
    """The renderer needs nothing but JSON scalars: a model read back from summary-style JSON
    renders to the same page."""
    model = sample_model(n_days=5)
    again = ReportModel(**json.loads(json.dumps(model.to_json())))
    assert render_html(again) == render_html(model)


# -- in a real browser -------------------------------------------------------------------------

PROBE = """(() => {
  const box = (el) => { const r = el.getBoundingClientRect(); return [r.width, r.height]; };
  const charts = [...document.querySelectorAll('svg.chart')].map((svg) => {
    const [w, h] = box(svg);
    const marks = [...svg.querySelectorAll('.mark')].filter((m) => {
      const [mw, mh] = box(m); return mw > 0 && mh > 0; }).length;
    const noData = [...svg.querySelectorAll('.no-data')].filter((t) => {
      const [tw, th] = box(t); return tw > 0 && th > 0 && t.textContent === 'no data'; }).length;
    return {name: svg.dataset.chart, width: w, height: h, marks, noData,
            title: (svg.querySelector(':scope > title') || {}).textContent || ''};
  });
  return {charts, scrollWidth: document.documentElement.scrollWidth,
          scripts: document.scripts.length, images: document.images.length};
})()"""


def test_a_browser_that_cannot_start_is_reported_as_such(tmp_path: Path) -> None:
    """What makes the browser tests skip, and only this: no binary, or one that exits."""
    with pytest.raises(ChromiumUnavailable, match="not installed"):
        with launch(str(tmp_path / "no-chromium")):
            pass
    with pytest.raises(ChromiumUnavailable, match="did not start"):
        with launch("/bin/false"):
            pass


@pytest.fixture(scope="module")
def browser() -> Iterator[Chromium]:
    try:
        with launch() as b:
            yield b
    except ChromiumUnavailable as exc:
        pytest.skip(f"headless chromium cannot start here: {exc}")


@pytest.fixture(scope="module")
def out_dir(request: pytest.FixtureRequest) -> Path:
    return Path(request.config.cache.mkdir("cost_report_html"))


def _open(browser: Chromium, model: ReportModel, path: Path, shot: Path | None = None) -> Any:
    path.write_text(render_html(model))
    report = open_page(browser, path.as_uri(), PROBE, width=WIDTH, screenshot=shot)
    assert report.errors == [], report.errors
    assert report.requests == [path.as_uri()], report.requests  # the page itself, nothing else
    probe = report.probe
    assert probe["scripts"] == 0 and probe["images"] == 0
    assert probe["scrollWidth"] <= WIDTH, "the page is wider than the window"
    assert sorted(c["name"] for c in probe["charts"]) == sorted(CHART_NAMES)
    for c in probe["charts"]:
        assert c["width"] > 0 and c["height"] > 0 and c["title"], c
    return probe


def test_browser_draws_every_chart(
    browser: Chromium, out_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shot = out_dir / "cost_report.png"
    shot.unlink(missing_ok=True)
    probe = _open(browser, sample_model(), out_dir / "report.html", shot)
    for c in probe["charts"]:
        assert c["marks"] > 0 and c["noData"] == 0, c
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 50_000
    assert int.from_bytes(png[16:20], "big") == WIDTH
    with capsys.disabled():
        print(f"\ncost report screenshot: {shot}")


def test_browser_hostile_and_edge_models(browser: Chromium, out_dir: Path) -> None:
    probe = _open(browser, hostile_model(), out_dir / "hostile.html", out_dir / "hostile.png")
    for c in probe["charts"]:
        assert c["marks"] > 0, c
    zero = _open(browser, zero_cost_model(), out_dir / "zero.html")
    assert all(c["marks"] > 0 for c in zero["charts"])


def test_browser_empty_model_shows_no_data(browser: Chromium, out_dir: Path) -> None:
    probe = _open(browser, empty_model(), out_dir / "empty.html", out_dir / "empty.png")
    for c in probe["charts"]:
        assert c["noData"] == 1 and c["marks"] == 0, c
