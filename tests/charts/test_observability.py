"""The operator's observability pack: the Grafana dashboard (charts/kumiki/dashboards/kumiki.json), the Prometheus
rules (charts/kumiki/rules/kumiki-rules.yaml) and the chart templates that ship them.

Metric names are checked against what the code registers in prometheus_client's REGISTRY, so renaming a metric
in the code fails here. The rules are checked and unit-tested with the real promtool (`apt-get install -y
prometheus` puts it in /usr/bin; Debian bookworm has 2.42), the templates with the real helm and kubeconform
(see test_chart.py). A test whose tool is missing is skipped with the install line.
"""

from __future__ import annotations

import importlib
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.charts.test_chart import (
    CHART,
    HELM,
    HELM_INSTALL,
    KUBE_VERSION,
    _kubernetes_schemas,
    find_tool,
    rejected,
    render,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVICES_ROOT = REPO_ROOT / "services"
DASHBOARD = CHART / "dashboards" / "kumiki.json"
RULES = CHART / "rules" / "kumiki-rules.yaml"
RULES_TEST = Path(__file__).with_name("rules_test.yaml")
PROMTOOL = find_tool("promtool")
PROMTOOL_INSTALL = "apt-get install -y prometheus (provides /usr/bin/promtool)"
KUBECONFORM_INSTALL = "go install github.com/yannh/kubeconform/cmd/kubeconform@v0.7.0"

needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason=f"promtool not installed: {PROMTOOL_INSTALL}")
needs_helm = pytest.mark.skipif(HELM is None, reason=f"helm not installed (PATH or ~/go/bin): {HELM_INSTALL}")

Json = dict[str, Any]

# Grafana's own variables; the dashboard defines the rest.
GRAFANA_BUILTINS = {"__rate_interval", "__range", "__interval", "__interval_ms", "__range_s"}
# Stand-ins for Grafana variables when an expression is handed to promtool
GRAFANA_SUBSTITUTES = {"__rate_interval": "5m", "__range": "1h", "__interval": "1m", "queue": ".*", "node": ".*"}
SEVERITIES = {"critical", "warning", "info"}
# Metric families of the services deliberately left off the dashboard: family -> why
NOT_CHARTED: dict[str, str] = {}


# -- metric names --------------------------------------------------------------------------------------------

PROMQL_KEYWORDS = {
    "and", "or", "unless", "bool", "by", "without", "on", "ignoring", "group_left", "group_right", "offset",
    "inf", "nan",
}  # fmt: skip
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGES = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_OFFSET = re.compile(r"\boffset\s+-?[0-9a-z]+", re.IGNORECASE)
_TOKEN = re.compile(r"[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?|[A-Za-z_:][A-Za-z0-9_:]*(?:\s*\()?")


def metric_names(expr: str) -> set[str]:
    """Names of the series a PromQL expression selects: identifiers that are not functions, aggregations,
    keywords, label names, durations or Grafana variables."""
    text = _STRING.sub('""', expr)
    text = re.sub(r"\$\{?\w+\}?", "", text)
    text = _MATCHERS.sub(" ", text)
    text = _RANGES.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    text = _OFFSET.sub(" ", text)
    names = set()
    for token in _TOKEN.findall(text):
        if token[0].isdigit() or token.endswith("(") or token.lower() in PROMQL_KEYWORDS:
            continue
        names.add(token)
    return names


def test_metric_names_are_read_from_promql_without_functions_labels_or_durations() -> None:
    assert metric_names('sum by (queue) (rate(a_total{queue=~"$queue",x="b c"}[$__rate_interval])) * 3600') == {
        "a_total"
    }
    assert metric_names("histogram_quantile(0.99, sum by (le) (rate(h_bucket[5m]))) > 0.005") == {"h_bucket"}
    assert metric_names("x / on () group_left(node) y unless z offset 15m") == {"x", "y", "z"}
    assert metric_names("count by (a) (time() - c_created < 9e2) or sum without (b) (rec:name:rate5m)") == {
        "c_created",
        "rec:name:rate5m",
    }
    assert _label_values_metric("label_values(kumiki_node_healthy, node)") == "kumiki_node_healthy"


def _modules_with_metrics() -> Iterator[str]:
    """Every module of the package that imports prometheus_client (so a new metrics module is found too)."""
    for path in sorted((SERVICES_ROOT / "kumiki").rglob("*.py")):
        source = path.read_text()
        if re.search(r"^\s*(from prometheus_client import|import prometheus_client)", source, re.MULTILINE):
            yield ".".join(path.relative_to(SERVICES_ROOT).with_suffix("").parts)


# sample names prometheus_client exposes for a family of each type
_EXPOSED_SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "info": ("_info",),
    "stateset": ("",),
    "enum": ("",),
    "unknown": ("",),
}


@pytest.fixture(scope="module")
def code_metrics() -> dict[str, str]:
    """Exposed sample name -> family name, for every metric the services register."""
    from prometheus_client import REGISTRY

    modules = list(_modules_with_metrics())
    assert "kumiki.placement.adapters.grpc" in modules and "kumiki.common.bus.metrics" in modules
    for module in modules:
        importlib.import_module(module)
    exposed = {}
    for family in REGISTRY.collect():
        for suffix in _EXPOSED_SUFFIXES[family.type]:
            exposed[family.name + suffix] = family.name
    return exposed


def _dashboard() -> Json:
    data: Json = json.loads(DASHBOARD.read_text())
    return data


def _rules() -> Json:
    data: Json = yaml.safe_load(RULES.read_text())
    return data


def _panels(dashboard: Json) -> Iterator[Json]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])  # collapsed rows keep theirs inside


def _dashboard_exprs(dashboard: Json) -> Iterator[tuple[str, str]]:
    """(where, PromQL) of every panel target and every query variable."""
    for panel in _panels(dashboard):
        for target in panel.get("targets", []):
            yield f"panel {panel['id']} {panel['title']!r} {target.get('refId')}", target.get("expr", "")
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            yield f"variable {variable['name']}", query["query"] if isinstance(query, dict) else query


def _rule_exprs(rules: Json) -> Iterator[tuple[str, str]]:
    for group in rules["groups"]:
        for rule in group["rules"]:
            yield rule.get("alert") or rule["record"], str(rule["expr"])


def _label_values_metric(query: str) -> str:
    match = re.fullmatch(r"\s*label_values\(\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*,\s*\w+\s*\)\s*", query)
    assert match, f"variable query is not label_values(metric, label): {query}"
    return match.group(1)


def test_every_metric_the_dashboard_queries_is_one_the_code_exports(code_metrics: dict[str, str]) -> None:
    """The dashboard uses the raw metrics only (no recording rule), so it works with or without the rules."""
    missing = {}
    for where, expr in _dashboard_exprs(_dashboard()):
        names = {_label_values_metric(expr)} if where.startswith("variable") else metric_names(expr)
        assert names, f"{where}: selects no metric: {expr}"
        for name in names - set(code_metrics):
            missing[name] = where
    assert not missing, f"not exported by any service: {missing}"


def test_every_metric_the_rules_query_is_exported_or_recorded_above(code_metrics: dict[str, str]) -> None:
    recorded: set[str] = set()
    for group in _rules()["groups"]:
        for rule in group["rules"]:
            names = metric_names(str(rule["expr"]))
            assert names, f"{rule.get('alert') or rule['record']}: selects no metric"
            unknown = names - set(code_metrics) - recorded
            assert not unknown, f"{rule.get('alert') or rule['record']}: {unknown} neither exported nor recorded"
            if "record" in rule:
                recorded.add(rule["record"])


def test_every_metric_family_of_the_services_is_on_the_dashboard(code_metrics: dict[str, str]) -> None:
    """A metric added to the code without a panel fails here: chart it, or list it in NOT_CHARTED with why."""
    charted = {
        code_metrics[name]
        for where, expr in _dashboard_exprs(_dashboard())
        if not where.startswith("variable")
        for name in metric_names(expr)
        if name in code_metrics  # an unknown name fails the test above
    }
    ours = {family for family in code_metrics.values() if family.startswith("kumiki_")}
    uncharted = ours - charted - set(NOT_CHARTED)
    assert not uncharted, f"no panel shows {sorted(uncharted)}"


def test_every_metric_family_is_listed_in_the_docs_with_its_panel(code_metrics: dict[str, str]) -> None:
    """docs/observability.md's "Every metric and its panel" names each family (counters with _total) in a row
    that names a dashboard row: a metric added or renamed in the code fails here until the docs say so."""
    docs = (REPO_ROOT / "docs" / "observability.md").read_text()
    section = docs[docs.index("## Every metric and its panel") :]
    rows = {line.split("`")[1]: line for line in section.splitlines() if line.startswith("| `kumiki_")}
    rows_titles = {panel["title"] for panel in _dashboard()["panels"] if panel["type"] == "row"}
    for family in sorted({f for f in code_metrics.values() if f.startswith("kumiki_")} - set(NOT_CHARTED)):
        shown = f"{family}_total" if f"{family}_total" in code_metrics else family
        assert shown in rows, f"docs/observability.md does not list {shown}"
        assert any(f"{title}: " in rows[shown] for title in rows_titles), f"{shown}: no panel named in the docs"


# -- the dashboard -------------------------------------------------------------------------------------------


def test_the_dashboard_is_a_grafana_model_with_a_prometheus_datasource_variable() -> None:
    dashboard = _dashboard()
    assert dashboard["schemaVersion"] >= 38
    assert dashboard["uid"] and dashboard["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("queue", "node"):
        assert variables[name]["type"] == "query"
        assert variables[name]["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert variables[name]["includeAll"] and variables[name]["multi"]


def test_every_panel_has_a_unique_id_and_queries_the_datasource_variable() -> None:
    dashboard = _dashboard()
    panels = list(_panels(dashboard))
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), f"duplicate panel ids: {sorted(i for i in ids if ids.count(i) > 1)}"
    variable_ref = {"type": "prometheus", "uid": "${datasource}"}
    for panel in panels:
        if panel["type"] in ("row", "text"):
            assert "targets" not in panel, f"panel {panel['id']}: a {panel['type']} has queries"
            continue
        assert panel["datasource"] == variable_ref, f"panel {panel['id']} {panel['title']!r}"
        assert panel["targets"], f"panel {panel['id']} {panel['title']!r} has no query"
        ref_ids = [target["refId"] for target in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), f"panel {panel['id']}: duplicate refIds"
        for target in panel["targets"]:
            assert target.get("expr", "").strip(), f"panel {panel['id']} {target['refId']}: no expr"
            assert target.get("datasource", variable_ref) == variable_ref, f"panel {panel['id']} {target['refId']}"


def test_every_variable_an_expression_uses_is_defined() -> None:
    dashboard = _dashboard()
    defined = {v["name"] for v in dashboard["templating"]["list"]} | GRAFANA_BUILTINS
    for where, expr in _dashboard_exprs(dashboard):
        used = set(re.findall(r"\$\{?(\w+)\}?", expr))
        assert used <= defined, f"{where}: undefined {used - defined}"


def test_panels_fit_the_24_column_grid_without_overlapping() -> None:
    cells: dict[tuple[int, int], int] = {}
    for panel in _panels(_dashboard()):
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["w"] > 0 and grid["h"] > 0 and grid["x"] + grid["w"] <= 24, panel["id"]
        for row in range(grid["y"], grid["y"] + grid["h"]):
            for column in range(grid["x"], grid["x"] + grid["w"]):
                assert (row, column) not in cells, f"panels {cells[(row, column)]} and {panel['id']} overlap"
                cells[(row, column)] = panel["id"]


def test_the_dashboard_has_the_rows_operators_look_for() -> None:
    """Each row holds at least one query panel (placement, utilisation, quota, telemetry, forecast)."""
    rows: dict[str, int] = {}
    current = None
    for panel in _dashboard()["panels"]:
        if panel["type"] == "row":
            current = panel["title"]
            rows[current] = len([p for p in panel.get("panels", []) if p.get("targets")])
        elif current is not None and panel.get("targets"):
            rows[current] += 1
    for title in ("Placement", "GPU utilisation", "Quota ledger", "Telemetry pipeline", "Forecast"):
        assert rows.get(title, 0) > 0, f"row {title!r}: {rows.get(title)}"


# Dashboard keys Grafana reads that grafana-foundation-sdk's types do not model (they are in Grafana's exports)
SDK_UNMODELLED = {"/annotations/list[0]/builtIn", "/templating/list[1]/definition", "/templating/list[2]/definition"}


def _lost_keys(original: Any, round_tripped: Any, path: str = "") -> Iterator[str]:
    if isinstance(original, dict):
        for key, value in original.items():
            if key not in round_tripped:
                yield f"{path}/{key}"
            else:
                yield from _lost_keys(value, round_tripped[key], f"{path}/{key}")
    elif isinstance(original, list):
        assert isinstance(round_tripped, list) and len(original) == len(round_tripped), path
        for index, (item, back) in enumerate(zip(original, round_tripped, strict=True)):
            yield from _lost_keys(item, back, f"{path}[{index}]")


def test_the_dashboard_round_trips_through_grafanas_schema_types() -> None:
    """grafana-foundation-sdk holds the types generated from Grafana's dashboard and panel-plugin schemas; a
    key they do not know (a misspelt option, field config or grid key) is dropped on the way through."""
    pytest.importorskip("grafana_foundation_sdk", reason="pip install grafana-foundation-sdk")
    from grafana_foundation_sdk.cog import plugins
    from grafana_foundation_sdk.models import dashboard as dashboard_model

    plugins.register_default_plugins()
    original = _dashboard()
    typed = dashboard_model.Dashboard.from_json(json.loads(json.dumps(original)))
    back = json.loads(json.dumps(typed.to_json(), default=lambda value: value.to_json()))
    lost = set(_lost_keys(original, back)) - SDK_UNMODELLED
    assert not lost, f"keys Grafana's schema does not know: {sorted(lost)}"
    misspelt = json.loads(json.dumps(original))
    misspelt["panels"][1]["options"]["colourMode"] = "background"
    typed = dashboard_model.Dashboard.from_json(misspelt)
    back = json.loads(json.dumps(typed.to_json(), default=lambda value: value.to_json()))
    assert "/panels[1]/options/colourMode" in set(_lost_keys(misspelt, back))  # the check can fail


@needs_promtool
def test_every_dashboard_expression_is_valid_promql(tmp_path: Path) -> None:
    """promtool parses each panel query (Grafana's variables replaced by values) as a recording rule."""
    dashboard = _dashboard()
    rules = []
    for index, (where, expr) in enumerate(_dashboard_exprs(dashboard)):
        if where.startswith("variable"):
            continue
        concrete = re.sub(r"\$\{?(\w+)\}?", lambda m: GRAFANA_SUBSTITUTES[m.group(1)], expr)
        rules.append({"record": f"dashboard:expr_{index}", "expr": concrete})
    rule_file = tmp_path / "dashboard-rules.yaml"
    rule_file.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = _promtool("check", "rules", str(rule_file))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


# -- the rules -----------------------------------------------------------------------------------------------


def _promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120, check=False, cwd=cwd)


def _alerts(rules: Json) -> dict[str, Json]:
    return {rule["alert"]: rule for group in rules["groups"] for rule in group["rules"] if "alert" in rule}


@needs_promtool
def test_promtool_accepts_the_rule_file() -> None:
    result = _promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    count = sum(len(group["rules"]) for group in _rules()["groups"])
    assert f"SUCCESS: {count} rules found" in result.stdout


@needs_promtool
def test_the_rules_unit_tests_pass() -> None:
    result = _promtool("test", "rules", str(RULES_TEST))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_is_unit_tested_firing_and_not_firing() -> None:
    """rules_test.yaml has, for each alert, an evaluation where it fires and one where it does not."""
    tests = yaml.safe_load(RULES_TEST.read_text())
    assert tests["rule_files"] == [str(Path("..", "..", RULES.relative_to(REPO_ROOT)))]
    fired: set[str] = set()
    quiet: set[str] = set()
    for case in tests["tests"]:
        for check in case.get("alert_rule_test", []):
            (fired if check.get("exp_alerts") else quiet).add(check["alertname"])
    alerts = set(_alerts(_rules()))
    assert alerts - fired == set(), "never shown firing"
    assert alerts - quiet == set(), "never shown quiet"


def test_every_alert_has_a_severity_a_summary_and_a_description() -> None:
    for name, rule in _alerts(_rules()).items():
        assert rule["labels"]["severity"] in SEVERITIES, name
        assert rule["annotations"]["summary"].strip() and rule["annotations"]["description"].strip(), name


@needs_promtool
@pytest.mark.parametrize(
    ("alert", "original", "mutated"),
    [
        ("KumikiBindLatencyHigh", "p99_5m > 0.005", "p99_5m > 0.5"),
        ("KumikiBindLatencyHigh", "for: 10m", "for: 1m"),
        ("KumikiBindsRefused", "ratio_rate10m > 0.05", "ratio_rate10m > 0.01"),
        ("KumikiDeadLetters", "_created < 900", "_created < 60"),
        ("KumikiTelemetrySampleLagHigh", "sample_lag_seconds) > 10", "sample_lag_seconds) > 1"),
        ("KumikiTelemetryStalled", "and on () sum(kumiki_node_healthy) > 0", ""),
        ("KumikiQueueIdleGpus", "rate10m > 4", "rate10m > 2"),
        ("KumikiGpusStranded", "sum >= 8", "sum >= 16"),
        ("KumikiForecastUnderCovering", "< 0.8", "< 0.5"),
        ("KumikiForecastUnderCovering", ">= 50", ">= 1"),
    ],
)
def test_the_unit_tests_catch_a_changed_threshold_or_duration(
    tmp_path: Path, alert: str, original: str, mutated: str
) -> None:
    """The unit tests bite: the same tests against a rule file with one threshold, duration or condition
    changed fail, naming the alert."""
    text = RULES.read_text()
    start = text.index(f"- alert: {alert}\n")
    end = text.find("- alert: ", start + 1)
    end = len(text) if end < 0 else end
    block = text[start:end]
    assert block.count(original) == 1, f"{original!r} not once in {alert}"
    rules_dir = tmp_path / "charts" / "kumiki" / "rules"
    rules_dir.mkdir(parents=True)
    (rules_dir / RULES.name).write_text(text[:start] + block.replace(original, mutated) + text[end:])
    tests_dir = tmp_path / "tests" / "charts"
    tests_dir.mkdir(parents=True)
    shutil.copy(RULES_TEST, tests_dir / RULES_TEST.name)
    result = _promtool("test", "rules", str(tests_dir / RULES_TEST.name))
    assert result.returncode != 0, f"{alert}: the tests still pass with {mutated!r}"
    assert f"alertname: {alert}" in result.stdout + result.stderr


# -- the chart templates -------------------------------------------------------------------------------------


ENABLED = ("--set", "grafana.dashboards.enabled=true", "--set", "prometheusRule.enabled=true")


@pytest.fixture(scope="module")
def enabled_manifests() -> list[Json]:
    if HELM is None:
        pytest.skip(f"helm not installed (PATH or ~/go/bin): {HELM_INSTALL}")
    return render(*ENABLED)


def _dashboard_configmaps(manifests: list[Json]) -> list[Json]:
    return [m for m in manifests if m["kind"] == "ConfigMap" and "kumiki.json" in m.get("data", {})]


@needs_helm
def test_by_default_neither_the_dashboard_nor_the_rules_are_rendered() -> None:
    manifests = render()
    assert _dashboard_configmaps(manifests) == []
    assert [m for m in manifests if m["kind"] == "PrometheusRule"] == []


@needs_helm
def test_the_dashboard_configmap_carries_the_file_byte_for_byte_with_the_sidecar_label(
    enabled_manifests: list[Json],
) -> None:
    (configmap,) = _dashboard_configmaps(enabled_manifests)
    assert configmap["data"]["kumiki.json"] == DASHBOARD.read_text()
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert "namespace" not in configmap["metadata"]  # the release's


@needs_helm
def test_the_dashboard_label_namespace_and_annotations_are_values() -> None:
    manifests = render(
        "--set", "grafana.dashboards.enabled=true",
        "--set", "grafana.dashboards.label=team/dashboards",
        "--set", "grafana.dashboards.labelValue=kumiki",
        "--set", "grafana.dashboards.namespace=monitoring",
        "--set", "grafana.dashboards.annotations.grafana_folder=GPU scheduling",
    )  # fmt: skip
    (configmap,) = _dashboard_configmaps(manifests)
    metadata = configmap["metadata"]
    assert metadata["labels"]["team/dashboards"] == "kumiki" and "grafana_dashboard" not in metadata["labels"]
    assert metadata["namespace"] == "monitoring"
    assert metadata["annotations"] == {"grafana_folder": "GPU scheduling"}


@needs_helm
def test_the_prometheusrule_spec_is_the_rule_file(enabled_manifests: list[Json]) -> None:
    (rule,) = [m for m in enabled_manifests if m["kind"] == "PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["spec"] == _rules()
    labelled = render(*ENABLED, "--set", "prometheusRule.labels.release=prometheus")
    (rule,) = [m for m in labelled if m["kind"] == "PrometheusRule"]
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    assert rule["metadata"]["labels"]["app.kubernetes.io/part-of"] == "kumiki"


@needs_helm
@needs_promtool
def test_promtool_accepts_the_rendered_prometheusrule_spec(enabled_manifests: list[Json], tmp_path: Path) -> None:
    """What the Prometheus Operator's admission webhook checks: the spec parses as a Prometheus rule file."""
    (rule,) = [m for m in enabled_manifests if m["kind"] == "PrometheusRule"]
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(rule["spec"]))
    result = _promtool("check", "rules", str(spec_file))
    assert result.returncode == 0, result.stdout + result.stderr


@needs_helm
@pytest.mark.parametrize(
    ("setting", "path"),
    [
        ("grafana.dashboards.enabeld=true", "/grafana/dashboards"),
        ("grafana.dashboards.enabled=yes", "/grafana/dashboards/enabled"),
        ("grafana.dashboards.label=bad label", "/grafana/dashboards/label"),
        ("prometheusRule.enabled=1", "/prometheusRule/enabled"),
        ("prometheusRule.lables.release=prometheus", "/prometheusRule"),
    ],
)
def test_the_schema_refuses_a_bad_observability_value(setting: str, path: str) -> None:
    assert f"at '{path}'" in rejected("--set", setting)


# A schema for monitoring.coreos.com/v1 PrometheusRule, written from the Prometheus Operator's API reference
# (the operator's own CRD schema is not reachable offline): the fields of a group and of a rule, nothing else.
_DURATION = {
    "type": "string",
    "pattern": "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$",
}
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
PROMETHEUS_RULE_SCHEMA: Json = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "groups": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["name"],
                        "properties": {
                            "name": {"type": "string", "minLength": 1},
                            "interval": _DURATION,
                            "query_offset": _DURATION,
                            "limit": {"type": "integer"},
                            "partial_response_strategy": {"type": "string"},
                            "labels": _STRING_MAP,
                            "rules": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "required": ["expr"],
                                    "oneOf": [{"required": ["record"]}, {"required": ["alert"]}],
                                    "properties": {
                                        "record": {"type": "string"},
                                        "alert": {"type": "string"},
                                        "expr": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
                                        "for": _DURATION,
                                        "keep_firing_for": _DURATION,
                                        "labels": _STRING_MAP,
                                        "annotations": _STRING_MAP,
                                    },
                                },
                            },
                        },
                    },
                }
            },
        },
    },
}


def _kubeconform(tmp_path: Path, manifests: list[Json]) -> subprocess.CompletedProcess[str]:
    """kubeconform -strict with the Kubernetes schemas of test_chart.py plus the PrometheusRule schema above."""
    kubeconform = find_tool("kubeconform")
    if kubeconform is None:
        pytest.skip(f"kubeconform not installed: {KUBECONFORM_INSTALL}")
    builtin = {(m["kind"], m["apiVersion"]) for m in manifests if m["kind"] != "PrometheusRule"}
    schemas = _kubernetes_schemas(tmp_path / "schemas", builtin)
    if schemas is None:
        pytest.skip("the kubernetes-validate wheel (Kubernetes JSON schemas) is not installed")
    crds = tmp_path / "crds" / "monitoring.coreos.com"
    crds.mkdir(parents=True)
    (crds / "prometheusrule_v1.json").write_text(json.dumps(PROMETHEUS_RULE_SCHEMA))
    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(yaml.safe_dump_all(manifests))
    command = [
        kubeconform, "-strict", "-summary", "-output", "json", "-kubernetes-version", KUBE_VERSION,
        "-schema-location", str(schemas),
        "-schema-location", str(tmp_path / "crds") + "/{{.Group}}/{{.ResourceKind}}_{{.ResourceAPIVersion}}.json",
        str(rendered),
    ]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


@needs_helm
def test_kubeconform_accepts_the_dashboard_configmap_and_the_prometheusrule(
    enabled_manifests: list[Json], tmp_path: Path
) -> None:
    objects = [m for m in enabled_manifests if m["kind"] == "PrometheusRule"] + _dashboard_configmaps(enabled_manifests)
    assert len(objects) == 2
    result = _kubeconform(tmp_path, objects)
    report = json.loads(result.stdout)
    assert result.returncode == 0, report
    assert report["summary"]["valid"] == 2 and report["summary"]["skipped"] == 0


@needs_helm
def test_kubeconform_with_the_prometheusrule_schema_refuses_a_misspelt_rule_field(
    enabled_manifests: list[Json], tmp_path: Path
) -> None:
    (rule,) = [json.loads(json.dumps(m)) for m in enabled_manifests if m["kind"] == "PrometheusRule"]
    alert = rule["spec"]["groups"][1]["rules"][0]
    alert["annotation"] = alert.pop("annotations")
    result = _kubeconform(tmp_path, [rule])
    assert result.returncode != 0
    assert "annotation" in result.stdout
