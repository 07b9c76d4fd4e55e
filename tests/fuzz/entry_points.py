"""Every way in that is not a gRPC call, as a function of one hostile input: the event decoder of each topic
(protobuf payload and CloudEvents headers), trace files, configuration (queue files, token files, the
environment), the node agent's recordings and samples, DCGM exporter pages, and Kubernetes pods as the binder
reads them (its watch must survive any pod the API server holds).

Each entry point returns an outcome: 'accepted', 'rejected-field' (the documented error type, its message naming
the field, header, column, variable or line), or a finding: 'crash: ...' (any other exception, or a rejection
that names nothing). Hangs are timed by the caller.
"""

from __future__ import annotations

import contextlib
import json
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from hypothesis import strategies as st

from kumiki.agent.core import (
    RecordError,
    SampleRejected,
    inventory_from_dict,
    inventory_to_dict,
    sample_from_dict,
    validate_sample,
)
from kumiki.agent.dcgm_core import read_exporter_page
from kumiki.common.bus import ALL_TOPICS, RejectedRecord, TopicSpec, decode
from kumiki.common.bus.cloudevents import CloudEventAttributes
from kumiki.common.config import ConfigError, Settings
from kumiki.quota.adapters.auth import load_tokens
from kumiki.quota.core import QueueConfigError, parse_config
from kumiki.sim.trace import NODE_COLUMNS, TRACE_COLUMNS, TraceError, load_jobs, load_nodes
from tests.fuzz.oracle import names_a_field
from tests.fuzz.strategies import mutated, payloads

FIXTURES = Path(__file__).resolve().parents[1] / "agent" / "fixtures"
_SCRATCH = Path(tempfile.mkdtemp(prefix="kumiki-fuzz-"))


@dataclass(frozen=True)
class EntryPoint:
    name: str
    inputs: st.SearchStrategy[Any]
    run: Callable[[Any], str]


def _crash(error: BaseException) -> str:
    return f"crash: {type(error).__name__}: {str(error)[:200]}"


# ---- events: one decoder per topic ------------------------------------------------------------------------
_HEADER_PROBLEM = re.compile(r"^header ce_(specversion|type|source|id|time): ")


def _ce_headers(spec: TopicSpec) -> st.SearchStrategy[list[tuple[str, Any]]]:
    """Valid CloudEvents headers, then damaged: dropped, not UTF-8, wrong types, a schema version or spec
    version we do not speak, an unparseable time, duplicated, oversized."""
    valid = CloudEventAttributes.new(spec.ce_type, "//kumiki/fuzz").headers()
    names = [name for name, _ in valid]
    bad_values = st.one_of(
        st.sampled_from(
            [
                b"",
                b"\xff\xfe",
                b"0.3",
                b"2.0",
                b" 1.0",
                spec.ce_type.replace(".v1.", ".v2.").encode(),
                spec.ce_type.replace(".v1.", ".v0.").encode(),
                b"dev.kumiki.v1.Other",
                b"2026-13-45T99:99:99Z",
                b"yesterday",
                b"x" * 70_000,
            ]
        ),
        st.binary(max_size=40),
        st.none(),
        st.text(max_size=10),  # a str where bytes belong: a client library that does not encode
        st.integers(),
    )

    @st.composite
    def build(draw: st.DrawFn) -> list[tuple[str, Any]]:
        headers: list[tuple[str, Any]] = list(valid)
        for _ in range(draw(st.integers(0, 3))):
            action = draw(st.sampled_from(["drop", "replace", "duplicate", "extra"]))
            if not headers:
                break
            at = draw(st.integers(0, len(headers) - 1))
            if action == "drop":
                del headers[at]
            elif action == "replace":
                headers[at] = (headers[at][0], draw(bad_values))
            elif action == "duplicate":
                headers.append((headers[at][0], draw(bad_values)))
            else:
                headers.append((draw(st.sampled_from([*names, "traceparent", "x"])), draw(bad_values)))
        return headers

    return build()


def _decoder(spec: TopicSpec) -> EntryPoint:
    assert spec.payload is not None
    descriptor = spec.payload.DESCRIPTOR
    inputs = st.tuples(
        st.one_of(st.none(), st.binary(max_size=24), st.just(b"\xff\xfe")),
        st.one_of(st.none(), payloads(descriptor, oversized=True)),
        _ce_headers(spec),
    )

    def run(record: tuple[bytes | None, bytes | None, list[tuple[str, Any]]]) -> str:
        key, value, headers = record
        try:
            decode(spec, key, value, headers)
        except RejectedRecord as error:
            reason = str(error)
            if _HEADER_PROBLEM.match(reason) or reason.startswith(("value: ", "key: ")):
                return "rejected-field"
            if names_a_field(descriptor, reason):
                return "rejected-field"
            return f"crash: a rejection naming no field: {reason[:200]}"
        except Exception as error:
            return _crash(error)
        return "accepted"

    return EntryPoint(f"decode {spec.name}", inputs, run)


# ---- trace files --------------------------------------------------------------------------------------------
_CELL = st.one_of(
    st.sampled_from(["", "0", "1", "8", "-1", "1.5", "nan", "inf", "-inf", "1e309", "abc", " 4 ", "0x10", '"', "job"]),
    st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=8),
)


@st.composite
def _csv(draw: st.DrawFn, columns: tuple[str, ...]) -> bytes:
    header = list(columns)
    if draw(st.integers(0, 9)) == 0:
        del header[draw(st.integers(0, len(header) - 1))]
    if draw(st.integers(0, 9)) == 0:
        header.append("extra")
    rows = [",".join(header)]
    for _ in range(draw(st.integers(0, 6))):
        width = len(header) + draw(st.sampled_from([0, 0, 0, 0, -1, 1]))
        rows.append(",".join(draw(_CELL).replace(",", ";").replace("\n", " ") for _ in range(max(width, 0))))
    text = "\n".join(rows).encode()
    if draw(st.integers(0, 9)) == 0:  # bytes that are not UTF-8
        text += draw(st.sampled_from([b"\xff\xfe", b"\xc0", b"\x00"]))
    return text


def _trace_file(loader: Callable[[Path], object], name: str) -> Callable[[bytes], str]:
    def run(content: bytes) -> str:
        path = _SCRATCH / f"{name}.csv"
        path.write_bytes(content)
        try:
            loader(path)
        except TraceError as error:
            text = str(error)
            if re.search(r"column '[a-z_]+'|header lacks|more fields|cannot open|not UTF-8", text):
                return "rejected-field"
            return f"crash: a rejection naming no column: {text[:200]}"
        except Exception as error:
            return _crash(error)
        return "accepted"

    return run


# ---- configuration ------------------------------------------------------------------------------------------
_YAML_VALUE = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-5, 100), st.floats(), st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=8,
)


def _queue_files() -> st.SearchStrategy[Any]:
    example = yaml.safe_load((Path(__file__).resolve().parents[2] / "docs" / "examples" / "queues.yaml").read_text())

    @st.composite
    def damaged(draw: st.DrawFn) -> Any:
        data = json.loads(json.dumps(example))  # a deep copy
        for _ in range(draw(st.integers(1, 3))):
            section = draw(st.sampled_from(["cluster", "rates", "queues", "extra"]))
            if section == "queues" and data.get("queues"):
                queue = draw(st.sampled_from(data["queues"]))
                field = draw(
                    st.sampled_from(
                        ["name", "parent", "guarantee", "limit", "weight", "priority_tiers", "owners", "unknown"]
                    )
                )
                queue[field] = draw(_YAML_VALUE)
            else:
                data[section] = draw(_YAML_VALUE)
        return data

    return st.one_of(damaged(), _YAML_VALUE)


def _queue_config(data: Any) -> str:
    try:
        parse_config(data)
    except QueueConfigError:
        return "rejected-field"  # where + field are constructor arguments: the message always names them
    except Exception as error:
        return _crash(error)
    return "accepted"


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a JSON-like value: dict keys and list positions, nested."""
    found: list[tuple[Any, ...]] = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, inner in value.items():
            found += _paths(inner, (*prefix, key))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            found += _paths(inner, (*prefix, index))
    return found


def _kubernetes_pods() -> st.SearchStrategy[Any]:
    """The example manifests' pod templates (required and preferred pod affinity, node affinity, topology
    spread, a GPU limit) with values somewhere replaced by others of the same type, or lists and maps cut."""
    examples = Path(__file__).resolve().parents[2] / "docs" / "examples"
    templates = []
    for name in ("spread-replicas.yaml", "prefer-replicas.yaml"):
        template = yaml.safe_load((examples / name).read_text())["spec"]["template"]
        templates.append(
            {"metadata": {"name": "p", "namespace": "ns", **template["metadata"]}, "spec": template["spec"]}
        )

    @st.composite
    def damaged(draw: st.DrawFn) -> Any:
        pod = json.loads(json.dumps(draw(st.sampled_from(templates))))  # a deep copy
        for _ in range(draw(st.integers(1, 4))):
            *parent, last = draw(st.sampled_from(_paths(pod)))
            holder = pod
            for step in parent:
                holder = holder[step]
            holder[last] = draw(_same_kind(holder[last]))
        return pod

    return damaged()


def _same_kind(value: Any) -> st.SearchStrategy[Any]:
    """Another value of the same JSON type: what the API server's schema lets through (it checks types, not
    what a scheduler needs), so the damage reaches the binder's own validation."""
    if isinstance(value, bool):
        return st.booleans()
    if isinstance(value, int):
        return st.integers(-(2**40), 2**40)
    if isinstance(value, str):
        return st.one_of(st.text(max_size=12), st.sampled_from(["", "In", "Exists", "Gt", "zone", "1", "-1"]))
    if isinstance(value, list):
        return st.one_of(st.just([]), st.just(value[:1] * 3), st.just(value[1:]))
    if isinstance(value, dict):
        drop = st.sampled_from(sorted(value)).map(lambda key: {k: v for k, v in value.items() if k != key})
        return st.one_of(drop, st.just({})) if value else st.just({})
    return st.just(value)


def _kubernetes_pod(obj: Any) -> str:
    """The binder's reading of a pod: never an exception (a pod the API holds must not stop its watch), and a
    request it cannot use is marked invalid with the field named (shown on the pod)."""
    from kumiki.binder import core

    try:
        pod = core.parse_pod(obj)
        spec = obj.get("spec")
        core.placed_pod({**obj, "spec": {**spec, "nodeName": "n1"}} if isinstance(spec, dict) else obj)  # another's
    except Exception as error:
        return _crash(error)
    if not pod.invalid:
        return "accepted"
    named = re.match(r"^[A-Za-z][\w.\[\]/-]*: ", pod.invalid)  # a field path first: spec.x[0].y, resources[...]
    return "rejected-field" if named else _crash(ValueError(pod.invalid))


def _tokens_file(content: str) -> str:
    path = _SCRATCH / "tokens.yaml"
    path.write_text(content)
    try:
        load_tokens(path)
    except ConfigError as error:
        return "rejected-field" if str(error).startswith("KUMIKI_QUOTA_TOKENS_FILE: ") else _crash(error)
    except Exception as error:
        return _crash(error)
    return "accepted"


_ENV_NAMES = (
    "KUMIKI_KAFKA_BOOTSTRAP", "KUMIKI_KAFKA_SECURITY_PROTOCOL", "KUMIKI_KAFKA_SASL_MECHANISM",
    "KUMIKI_KAFKA_SASL_USERNAME", "KUMIKI_KAFKA_SASL_PASSWORD", "KUMIKI_KAFKA_SASL_PASSWORD_FILE",
    "KUMIKI_KAFKA_SSL_CAFILE", "KUMIKI_TOPIC_PREFIX", "KUMIKI_KAFKA_PARTITIONS", "KUMIKI_KAFKA_IDEMPOTENT",
    "KUMIKI_KAFKA_LINGER_MS", "KUMIKI_KAFKA_EMPTY_FETCH_PAUSE_MS", "KUMIKI_DATABASE_URL", "KUMIKI_DATABASE_POOL_MIN",
    "KUMIKI_DATABASE_POOL_MAX",
    "KUMIKI_BIND_HOST", "KUMIKI_PLACEMENT_GRPC_PORT", "KUMIKI_PLACEMENT_HTTP_PORT", "KUMIKI_TLS_CERTFILE",
    "KUMIKI_TLS_KEYFILE", "KUMIKI_TLS_CLIENT_CAFILE", "KUMIKI_LOG_LEVEL", "OTEL_EXPORTER_OTLP_ENDPOINT",
)  # fmt: skip
_ENV_VALUE = st.one_of(
    st.sampled_from(
        ["", "0", "1", "-1", "65536", "true", "maybe", "SASL_SSL", "SSL", "PLAINTEXT", "SCRAM-SHA-512", "MD5",
         "host:1", "host", ":9092", "a:b", "postgresql://u@h/db", "mysql://h", "http://x:4317", "ftp://x",
         "/nonexistent", "/etc/hostname", "DEBUG", "x" * 300, "kumiki.", "bad prefix!"]
    ),
    st.text(alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"), max_size=12),
)  # fmt: skip


def _environment(env: dict[str, str]) -> str:
    try:
        Settings.from_env("placement", env)
    except ConfigError as error:
        name = str(error).partition(":")[0]
        return "rejected-field" if name in _ENV_NAMES else _crash(error)
    except Exception as error:
        return _crash(error)
    return "accepted"


# ---- the node agent and DCGM ingest ------------------------------------------------------------------------
_PAGE_LINES = (FIXTURES / "dcgm_exporter_a100_mig.prom").read_text().splitlines()


@st.composite
def _exporter_pages(draw: st.DrawFn) -> str:
    lines = list(_PAGE_LINES)
    for _ in range(draw(st.integers(1, 6))):
        at = draw(st.integers(0, len(lines) - 1))
        action = draw(st.sampled_from(["drop", "repeat", "garble", "value", "label", "truncate"]))
        if action == "drop":
            del lines[at]
        elif action == "repeat":
            lines.insert(at, lines[at])
        elif action == "garble":
            lines[at] = draw(mutated(lines[at].encode())).decode("utf-8", "replace")
        elif action == "value":
            head, _, _ = lines[at].rpartition(" ")
            lines[at] = f"{head} {draw(st.sampled_from(['NaN', '+Inf', '-1', '1e400', 'x', '99999999999999999999']))}"
        elif action == "label":
            lines[at] = re.sub(
                r'"[^"]*"', lambda _: '"' + draw(st.sampled_from(["", "-1", 'x"y', "9" * 30])) + '"', lines[at], count=1
            )
        else:
            lines[at] = lines[at][: draw(st.integers(0, len(lines[at])))]
        if not lines:
            break
    return "\n".join(lines)


def _dcgm(text: str) -> str:
    try:
        reading = read_exporter_page(text, None, 1_700_000_000.0)
        for sample in reading.samples:
            with contextlib.suppress(SampleRejected):
                validate_sample(sample)
    except Exception as error:
        return _crash(error)
    if any(not re.match(r"^line \d+: |^[A-Za-z_]", problem) for problem in reading.errors):
        return f"crash: an error naming no line: {reading.errors[:2]}"
    return "rejected-field" if reading.errors else "accepted"


_SAMPLE = {
    "node": "gpu-node-7", "gpu_uuid": "GPU-1", "gpu_index": 0, "mig_instance_id": None, "timestamp": 1.7e9,
    "fields": {"gpu_util_pct": 50.0, "memory_util_pct": 10.0, "memory_used_bytes": 1, "memory_total_bytes": 2,
               "power_w": 100.0, "temperature_c": 40.0},
    "labels": {}, "model": "A100", "source": "nvml",
}  # fmt: skip


@st.composite
def _recorded_samples(draw: st.DrawFn) -> Any:
    sample = json.loads(json.dumps(_SAMPLE))
    for _ in range(draw(st.integers(1, 3))):
        fields = sample.get("fields")
        target = fields if isinstance(fields, dict) and draw(st.booleans()) else sample
        key = draw(st.sampled_from([*target.keys(), "unknown"]))
        if draw(st.integers(0, 5)) == 0:
            target.pop(key, None)
        else:
            target[key] = draw(_YAML_VALUE)
    return sample if draw(st.integers(0, 9)) else draw(_YAML_VALUE)


def _recorded_sample(data: Any) -> str:
    try:
        validate_sample(sample_from_dict(data, "samples.jsonl:1: "))
    except (RecordError, SampleRejected):
        return "rejected-field"
    except Exception as error:
        return _crash(error)
    return "accepted"


_INVENTORY = inventory_to_dict(read_exporter_page("\n".join(_PAGE_LINES), None, 1.7e9).inventory)


@st.composite
def _recorded_inventories(draw: st.DrawFn) -> Any:
    """The inventory the fixture page describes, with values replaced anywhere in its tree."""
    data = json.loads(json.dumps(_INVENTORY))
    for _ in range(draw(st.integers(1, 3))):
        target: Any = data
        while isinstance(target, dict | list) and target and draw(st.booleans()):
            key = draw(st.sampled_from(list(target) if isinstance(target, dict) else range(len(target))))
            if not isinstance(target[key], dict | list):
                break
            target = target[key]
        if isinstance(target, dict) and target:
            target[draw(st.sampled_from([*target, "unknown"]))] = draw(_YAML_VALUE)
        elif isinstance(target, list) and target:
            target[draw(st.integers(0, len(target) - 1))] = draw(_YAML_VALUE)
    return data if draw(st.integers(0, 9)) else draw(_YAML_VALUE)


def _recorded_inventory(data: Any) -> str:
    try:
        inventory_from_dict(data)
    except RecordError:
        return "rejected-field"
    except Exception as error:
        return _crash(error)
    return "accepted"


def entry_points() -> list[EntryPoint]:
    points = [_decoder(spec) for spec in ALL_TOPICS if spec.payload is not None]
    points += [
        EntryPoint("trace file (jobs)", _csv(TRACE_COLUMNS), _trace_file(load_jobs, "jobs")),
        EntryPoint("trace file (nodes)", _csv(NODE_COLUMNS), _trace_file(load_nodes, "nodes")),
        EntryPoint("quota queue file", _queue_files(), _queue_config),
        EntryPoint("kubernetes pod (binder)", _kubernetes_pods(), _kubernetes_pod),
        EntryPoint(
            "quota tokens file",
            st.one_of(_YAML_VALUE.map(yaml.safe_dump), st.text(max_size=80), st.just("a" * 64 + ": alice")),
            _tokens_file,
        ),
        EntryPoint("service environment", st.dictionaries(st.sampled_from(_ENV_NAMES), _ENV_VALUE, max_size=6),
                   _environment),
        EntryPoint("dcgm exporter page", st.one_of(_exporter_pages(), st.text(max_size=200)), _dcgm),
        EntryPoint("agent recorded sample", _recorded_samples(), _recorded_sample),
        EntryPoint("agent recorded inventory", _recorded_inventories(), _recorded_inventory),
    ]  # fmt: skip
    return points
