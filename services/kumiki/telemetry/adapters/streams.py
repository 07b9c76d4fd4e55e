"""The faust-streaming application: three thin agents around the pure core.

  1. ingest      gpu.samples + node.inventory (raw bytes) → kumiki.common.bus.codec.decode → dead-letter the
                 rejects exactly as kumiki.common.bus.consumer does, and the samples of unregistered nodes
                 (KnownNodes) → one NodeChunk per (node, time bucket) per batch → <app>-node-input, one record
                 per partition holding many nodes' items (partition = Kafka's default partitioner on the node
                 name, so tables stay co-partitioned). Flow control keeps at most two batches in stage 2.
     lifecycle   job.lifecycle → JobPlacement table (by job) → AllocationChange per node → node-input.
  2. nodes       node-input: NodeRecord table (one write per node per record), per-GPU and per-node tumbling
                 windows, cluster.state and gpu.idle through the bus EventProducer (awaited together per
                 record), usage per job and queue → <app>-usage in batch records. The two node tables'
                 changelog records go out in record batches of faust's producer (`_write_changelog`).
  3. usage       <app>-usage: per-job and per-queue hopping windows, queue gauges.
A timer asks (through node-input, so the node agent's partition owner decides) whether silent nodes are stale.

Tables are faust tables with changelog topics (memory store: a restarted worker rebuilds them from the
changelog). Internal records are JSON; public ones stay protobuf with CloudEvents headers.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol, cast

import faust
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.partitioner import murmur2

from kumiki.common.bus.admin import start_client
from kumiki.common.bus.codec import RejectedRecord, decode
from kumiki.common.bus.metrics import CONSUMED, DEAD_LETTERED
from kumiki.common.bus.producer import EventProducer, RecordBatches
from kumiki.common.bus.topics import (
    CLUSTER_STATE,
    DEAD_LETTER,
    GPU_IDLE,
    GPU_SAMPLES,
    JOB_LIFECYCLE,
    NODE_INVENTORY,
    TopicSpec,
)
from kumiki.common.config import KafkaSettings
from kumiki.common.contracts.v1 import events_pb2
from kumiki.common.metrics import labelled
from kumiki.telemetry import core
from kumiki.telemetry.adapters import convert, metrics
from kumiki.telemetry.adapters.codecs import NodeRecordJson
from kumiki.telemetry.adapters.commits import CommitWatch
from kumiki.telemetry.adapters.known_nodes import KnownNodes
from kumiki.telemetry.adapters.samples import FastSamples

log = logging.getLogger(__name__)

Clock = Callable[[], float]
Json = dict[str, Any]

# Internal records carry many items (one per node chunk, inventory, usage key) per partition: stage 2's cost
# is per faust event, and live chunks are small. The cap keeps a record far below the broker's 1 MB limit.
MAX_ITEMS_PER_RECORD = 100


def faust_broker_options(settings: KafkaSettings) -> dict[str, Any]:
    """faust's spelling of our broker settings (TLS and SASL included)."""
    options: dict[str, Any] = {
        "broker": ",".join(f"kafka://{part.strip()}" for part in settings.bootstrap.split(",")),
        "topic_replication_factor": settings.replication_factor,
        "topic_partitions": settings.default_partitions,
    }
    client = settings.client_options()
    ssl_context: Any = client.get("ssl_context")
    if settings.security_protocol.startswith("SASL"):
        options["broker_credentials"] = faust.SASLCredentials(
            username=settings.sasl_username,
            password=settings.sasl_password,
            mechanism=settings.sasl_mechanism,
            ssl_context=ssl_context,
        )
    elif ssl_context is not None:
        options["broker_credentials"] = faust.SSLCredentials(ssl_context)
    return options


def dead_letter_headers(
    headers: Sequence[tuple[str, bytes]], reason: str, topic: str, partition: int, offset: int, group: str
) -> list[tuple[str, bytes]]:
    """The headers kumiki.common.bus.consumer puts on a dead letter (same names, same order)."""
    return [
        *headers,
        ("kumiki_dlq_reason", reason.encode()),
        ("kumiki_dlq_topic", topic.encode()),
        ("kumiki_dlq_partition", str(partition).encode()),
        ("kumiki_dlq_offset", str(offset).encode()),
        ("kumiki_dlq_group", group.encode()),
    ]


def _header_list(headers: Any) -> list[tuple[str, bytes]]:
    """faust hands headers over as a list of pairs or a mapping, depending on the path a record took."""
    if not headers:
        return []
    items = headers.items() if hasattr(headers, "items") else headers
    return [(str(key), bytes(value) if value is not None else b"") for key, value in items]


class Consumed(Protocol):
    """A consumed record: aiokafka's ConsumerRecord as it is (no copy per sample), or a `Record`."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> Sequence[tuple[str, bytes]]: ...


@dataclass(frozen=True, slots=True)
class Record:
    """A consumed record, whichever client read it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]

    @classmethod
    def of_faust(cls, event: Any) -> Record:
        message = event.message
        return cls(
            message.topic, message.partition, message.offset, message.key, message.value, _header_list(message.headers)
        )


@dataclass(frozen=True, slots=True)
class _At:
    """What a windowed table reads an item's time from (`_bucket_time`): one record holds many items, each
    with its own bucket, while the changelog partition still comes from the record being processed."""

    value: Json


def _items(data: Json) -> list[Json]:
    return list(data["items"]) if data.get("kind") == "batch" else [data]


def _raw_topic(app: Any, name: str) -> Any:
    return app.topic(name, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")


class TelemetryStreams:
    """Builds the faust app; `start()`/`stop()` run it inside the caller's event loop."""

    def __init__(
        self,
        settings: KafkaSettings,
        config: core.TelemetryConfig,
        producer: EventProducer,
        *,
        batch_size: int | None = None,
        batch_window_s: float | None = None,
        clock: Clock = time.time,
        front_end: str = "aiokafka",
        name: str = "telemetry-ingest",
        commit_stall_s: float = 0.0,
    ) -> None:
        self.settings = settings
        self.config = config
        self.producer = producer
        self.clock = clock
        self.batch_size = batch_size or config.batch_max
        self.batch_window_s = config.batch_window_s if batch_window_s is None else batch_window_s
        batch_size = self.batch_size
        self.app_id = f"{settings.topic_prefix}{name}"  # consumer group and changelog topic names
        self.front_end = front_end
        self._front: AIOKafkaConsumer | None = None
        self._front_task: asyncio.Task[None] | None = None
        self.samples_seen = 0
        self.dead_lettered = 0
        self.published_states = 0
        self.published_idle = 0
        self.samples_applied = 0  # samples folded into node state (stage 2): what "ingested" means end to end
        self.unknown_rejected = 0
        self.partitions = settings.default_partitions
        self._partition_of: dict[str, int] = {}
        # Flow control: the newest node-input offset stage 2 has folded, per partition this worker holds.
        self._folded: dict[int, int] = {}
        self._folded_changed = asyncio.Event()
        self.flow_waits = 0
        self._changelog_failure: BaseException | None = None
        self.commit_stall_s = commit_stall_s  # 0: no watch on the group's commits
        self.commits: CommitWatch | None = None
        self.known_nodes = KnownNodes(settings, (NODE_INVENTORY, CLUSTER_STATE))
        self.app: Any = cast(Any, faust.App)(
            self.app_id,
            **faust_broker_options(settings),
            store="memory://",
            # faust makes a data folder even for memory tables; keep it out of the working directory
            datadir=str(Path(tempfile.gettempdir()) / f"kumiki-faust-{self.app_id}"),
            web_enabled=False,
            topic_disable_leader=True,
            processing_guarantee="at_least_once",
            consumer_auto_offset_reset="earliest",
            producer_acks=-1,
            producer_linger=0.005,  # batch changelog and internal records: one request per chunk burst
            stream_wait_empty=False,
            broker_commit_every=batch_size,
            broker_commit_interval=1.0,
            stream_buffer_maxsize=max(4096, 2 * batch_size),
            table_cleanup_interval=60.0,
            broker_session_timeout=config.session_timeout_s,
            broker_heartbeat_interval=min(3.0, config.session_timeout_s / 3),
            logging_config=None,
        )
        prefix = settings.topic_prefix
        self.specs: dict[str, TopicSpec] = {
            spec.full_name(prefix): spec for spec in (GPU_SAMPLES, NODE_INVENTORY, JOB_LIFECYCLE)
        }
        self.samples_topic = _raw_topic(self.app, GPU_SAMPLES.full_name(prefix))
        self._samples_topic_name = GPU_SAMPLES.full_name(prefix)
        self._fast_samples = FastSamples()
        self.inventory_topic = _raw_topic(self.app, NODE_INVENTORY.full_name(prefix))
        self.lifecycle_topic = _raw_topic(self.app, JOB_LIFECYCLE.full_name(prefix))
        json_topic: dict[str, Any] = {
            "key_serializer": "raw",
            "value_serializer": "json",
            "internal": True,
            "partitions": settings.default_partitions,
        }
        self.node_input = self.app.topic(f"{self.app_id}-node-input", **json_topic)
        self.usage_topic = self.app.topic(f"{self.app_id}-usage", **json_topic)

        table: dict[str, Any] = {
            "schema": faust.Schema(key_serializer="json", value_serializer="json"),
            "partitions": settings.default_partitions,
        }
        self.node_records = self.app.Table("node-records", **table)
        self.node_records.value_serializer = NodeRecordJson()  # the changelog's codec (faust ignores the schema's)
        self.job_placements = self.app.Table("job-placements", **table)
        expires = timedelta(seconds=config.window_expires_s)
        by_bucket = self._bucket_time
        self.node_windows = (
            self.app.Table("node-windows", default=dict, **table)
            .tumbling(config.gpu_window_s, expires=expires)
            .relative_to(by_bucket)
        )
        self.job_windows = (
            self.app.Table("job-windows", default=dict, **table)
            .hopping(config.usage_window_s, config.usage_step_s, expires=expires)
            .relative_to(by_bucket)
        )
        self.queue_windows = (
            self.app.Table("queue-windows", default=dict, **table)
            .hopping(config.usage_window_s, config.usage_step_s, expires=expires)
            .relative_to(by_bucket)
        )

        if front_end == "faust":
            self.app.agent(
                self.app.topic(
                    self.samples_topic.get_topic_name(),
                    self.inventory_topic.get_topic_name(),
                    key_type=bytes,
                    value_type=bytes,
                    key_serializer="raw",
                    value_serializer="raw",
                ),
                name="ingest",
            )(self._ingest)
        self.app.agent(self.lifecycle_topic, name="lifecycle")(self._lifecycle)
        self.app.agent(self.node_input, name="nodes")(self._nodes)
        self.app.agent(self.usage_topic, name="usage")(self._usage)
        self.app.timer(max(0.1, config.node_timeout_s / 3), name="stale-nodes")(self._check_stale_nodes)

    @staticmethod
    def _bucket_time(event: Any) -> float:
        return float(event.value["bucket"])

    # -- lifecycle --------------------------------------------------------------------------------

    def partition_for(self, key: str) -> int:
        """Every record of node-input and usage names its partition: the hash of the node (or usage key), as
        Kafka's default partitioner would, so a batch of many nodes' items lands where each node's single
        records do and every table write stays co-partitioned with its key."""
        partition = self._partition_of.get(key)
        if partition is None:
            partition = self._partition_of[key] = (murmur2(key.encode()) & 0x7FFFFFFF) % self.partitions
        return partition

    async def _send_items(self, topic: Any, items: Sequence[tuple[str, Json]]) -> list[Any]:
        """Group (key, item) by partition into batch records; returns the send futures."""
        by_partition: dict[int, list[Json]] = {}
        for key, item in items:
            by_partition.setdefault(self.partition_for(key), []).append(item)
        sent = []
        for partition, group in by_partition.items():
            for start in range(0, len(group), MAX_ITEMS_PER_RECORD):
                part = group[start : start + MAX_ITEMS_PER_RECORD]
                sent.append(
                    await topic.send(
                        key=str(part[0].get("node") or part[0].get("key")),
                        value={"kind": "batch", "items": part},
                        partition=partition,
                    )
                )
        return sent

    async def start(self) -> None:
        await self.known_nodes.start()
        self.app.on_partitions_revoked.connect(self._forget_folded)
        await self.app.start()
        if self.front_end == "aiokafka":
            self._front = AIOKafkaConsumer(
                self.samples_topic.get_topic_name(),
                self.inventory_topic.get_topic_name(),
                **self.settings.client_options(),
                group_id=f"{self.app_id}-front",
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                max_poll_records=self.batch_size,
                session_timeout_ms=int(self.config.session_timeout_s * 1000),
                heartbeat_interval_ms=int(min(3.0, self.config.session_timeout_s / 3) * 1000),
            )
            await start_client(self._front, self.settings)
            self._front_task = asyncio.create_task(self._run_front(), name="telemetry-front-end")
        if self.commit_stall_s > 0:
            self.commits = CommitWatch(
                self.settings,
                self.app_id,
                self._committed_partitions,
                self.commit_stall_s,
                describe=self._faust_commit_view,
            )
            await self.commits.start(lambda: self.recovered and not self.app.rebalancing)

    async def stop(self) -> None:
        if self.commits is not None:
            await self.commits.stop()
        if self._front_task is not None:
            self._front_task.cancel()
            await asyncio.gather(self._front_task, return_exceptions=True)
        if self._front is not None:
            await self._front.stop()
        await self.app.stop()
        await self.known_nodes.stop()

    def _committed_partitions(self) -> list[TopicPartition]:
        """The partitions this worker holds of the topics its faust group commits on."""
        topics = {topic.get_topic_name() for topic in (self.lifecycle_topic, self.node_input, self.usage_topic)}
        return [TopicPartition(tp.topic, tp.partition) for tp in self.app.consumer.assignment() if tp.topic in topics]

    def _faust_commit_view(self, partition: TopicPartition) -> str:
        """What faust's own bookkeeping holds for a stalled partition, for the error that names it."""
        consumer = self.app.consumer
        tp = next((tp for tp in consumer.assignment() if (tp.topic, tp.partition) == partition), None)
        if tp is None:
            return "no longer assigned here"
        acked = sorted(getattr(consumer, "_acked", {}).get(tp, ()))
        gaps = getattr(consumer, "_gap", {}).get(tp)
        return (
            f"faust: committed {getattr(consumer, '_committed_offset', {}).get(tp)},"
            f" read {getattr(consumer, '_read_offset', {}).get(tp)}, {len(acked)} acked from {acked[:3]},"
            f" gaps {sorted((gap.begin, gap.end) for gap in gaps) if gaps else []}"
        )

    async def _forget_folded(self, *args: Any, **kwargs: Any) -> None:
        """After a rebalance this worker may not hold the partitions it waited on: learn them again."""
        self._folded.clear()
        self._folded_changed.set()

    async def _wait_folded(self, sent: Sequence[Any]) -> None:
        """Flow control: wait until this worker's stage 2 has folded what `sent` put on the partitions it
        holds (others' are another worker's). Meanwhile samples queue up in gpu.samples, so the next batch is
        bigger, its chunks hold more ticks per node, and stage 2 costs less per sample: a worker that falls
        behind catches up instead of spending its time on one-tick chunks."""
        targets: dict[int, int] = {}
        for metadata in await asyncio.gather(*sent):
            targets[metadata.partition] = max(targets.get(metadata.partition, -1), metadata.offset)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(5.0, 10 * self.batch_window_s)  # never stall on a partition moved away
        waited = False
        while True:
            behind = [p for p, offset in targets.items() if self._folded.get(p, offset) < offset]
            remaining = deadline - loop.time()
            if not behind or remaining <= 0:
                break
            waited = True
            self._folded_changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._folded_changed.wait(), remaining)
        self.flow_waits += waited

    async def _run_front(self) -> None:
        """The aiokafka front end of stage 1: a batch's offsets are committed once its chunks are acknowledged
        (at least once; stage 2 skips a chunk it has already folded in). At most two batches are in stage 2
        at a time (`_wait_folded`)."""
        assert self._front is not None
        loop = asyncio.get_running_loop()
        previous: asyncio.Task[None] | None = None
        in_stage_2: collections.deque[list[Any]] = collections.deque()
        while True:
            while len(in_stage_2) >= 2:
                await self._wait_folded(in_stage_2.popleft())
            # Fill a batch up to batch_size or batch_window_s: bigger batches make bigger node chunks, and
            # stage 2's cost is per chunk.
            records: list[Consumed] = []
            offsets: dict[Any, int] = {}
            deadline = loop.time() + self.batch_window_s
            while len(records) < self.batch_size:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                batches = await self._front.getmany(
                    timeout_ms=max(1, int(remaining * 1000)), max_records=self.batch_size - len(records)
                )
                for partition, partition_records in batches.items():
                    records += partition_records
                    offsets[partition] = partition_records[-1].offset + 1
            if not records:
                continue
            sent = await self.ingest_batch(records)
            in_stage_2.append(sent)
            # Fetch the next batch while this one's chunks are acknowledged; commits stay in batch order.
            if previous is not None and previous.done():
                previous.result()  # a failed commit stops the front end (and readiness)
            previous = asyncio.create_task(self._commit_after(previous, sent, offsets))

    async def _commit_after(
        self, previous: asyncio.Task[None] | None, sent: list[Any], offsets: dict[Any, int]
    ) -> None:
        if previous is not None:
            await previous
        await asyncio.gather(*sent)
        assert self._front is not None
        await self._front.commit(offsets)

    @property
    def recovered(self) -> bool:
        """True once the tables are rebuilt from their changelogs for the current assignment."""
        return bool(self.app.tables.recovery.completed.is_set())

    async def wait_recovered(self, timeout_s: float) -> None:
        await asyncio.wait_for(self.app.tables.recovery.completed.wait(), timeout_s)

    def crash_reason(self) -> BaseException | None:
        if self._changelog_failure is not None:
            return self._changelog_failure
        if self.commits is not None and self.commits.failure is not None:
            return self.commits.failure
        task = self._front_task
        if task is not None and task.done() and not task.cancelled() and task.exception() is not None:
            return task.exception()
        reason = self.app._crash_reason  # mode keeps why a service crashed here
        return reason if isinstance(reason, BaseException) else None

    # -- stage 1 ----------------------------------------------------------------------------------

    async def dead_letter(self, record: Consumed, reason: str) -> None:
        headers = dead_letter_headers(
            list(record.headers or ()), reason, record.topic, record.partition, record.offset, self.app_id
        )
        await self.producer.send_raw(
            DEAD_LETTER.full_name(self.settings.topic_prefix), record.key, record.value, headers
        )
        self.dead_lettered += 1
        labelled(DEAD_LETTERED, self.specs[record.topic].name, self.app_id).inc()
        log.warning("dead-lettered record", extra={"topic": record.topic, "offset": record.offset, "reason": reason})

    async def ingest_batch(self, records: Sequence[Consumed]) -> list[Any]:
        """Stage 1 for one batch: decode, dead-letter, summarise, forward. Returns the send futures: the
        caller commits the batch's offsets only once they are all acknowledged."""
        sampled: list[Consumed] = []  # the records of `readings`, index for index
        readings: list[core.Reading] = []
        items: list[tuple[str, Json]] = []
        fast = self._fast_samples.reading
        samples_topic = self._samples_topic_name
        for record in records:
            if record.topic == samples_topic:
                reading = fast(record.key, record.value, record.headers)
                if reading is not None:  # else decode() decides, and names the reason of a reject
                    sampled.append(record)
                    readings.append(reading)
                    continue
            try:
                payload = decode(self.specs[record.topic], record.key, record.value, record.headers).payload
            except RejectedRecord as error:
                await self.dead_letter(record, f"undecodable: {error}")
                continue
            if isinstance(payload, events_pb2.GpuSample):
                sampled.append(record)
                readings.append(convert.reading_from_sample(payload))
            else:
                assert isinstance(payload, events_pb2.NodeState)
                inventory = convert.inventory_from_state(payload)
                self.known_nodes.add(NODE_INVENTORY, inventory.node)
                items.append((inventory.node, inventory.to_json()))
        # Registration is checked per chunk (one per node), not per sample.
        chunks = core.summarise(readings, self.config.bucket_s)
        unknown = {chunk.node for chunk in chunks if chunk.node not in self.known_nodes}
        if unknown:
            unknown = await self._dead_letter_unknown(unknown, sampled, readings)
            chunks = [chunk for chunk in chunks if chunk.node not in unknown]
        if chunks:
            gpus = [gpu for chunk in chunks for gpu in chunk.gpus.values()]
            count = sum(gpu.samples for gpu in gpus)
            now = self.clock()
            metrics.SAMPLE_LAG.set(max(0.0, now - max(gpu.last_ts for gpu in gpus)))
            metrics.SAMPLE_LAG_SECONDS.observe(max(0.0, now - min(gpu.first_ts for gpu in gpus)))
            metrics.SAMPLES.inc(count)
            labelled(CONSUMED, GPU_SAMPLES.name, self.app_id).inc(count)
            self.samples_seen += count
            items += [(chunk.node, chunk.to_json()) for chunk in chunks]
        return await self._send_items(self.node_input, items)

    async def _dead_letter_unknown(
        self, missing: set[str], sampled: Sequence[Consumed], readings: Sequence[core.Reading]
    ) -> set[str]:
        """The nodes still unregistered once the registry has caught up; their samples go to the dead-letter
        topic, original bytes intact."""
        await self.known_nodes.catch_up()  # registrations published before these samples are read now
        unknown = {node for node in missing if node not in self.known_nodes}
        rejected = [
            (record, reading.node) for record, reading in zip(sampled, readings, strict=True) if reading.node in unknown
        ]
        sources = self.known_nodes.topic_names
        await asyncio.gather(
            *(self.dead_letter(record, core.unknown_node_reason(node, sources)) for record, node in rejected)
        )
        self.unknown_rejected += len(rejected)
        return unknown

    def _decode(self, event: Any) -> Any:
        record = Record.of_faust(event)
        return decode(self.specs[record.topic], record.key, record.value, record.headers).payload

    async def _ingest(self, stream: Any) -> None:
        """The faust front end of stage 1 (KUMIKI_TELEMETRY_FRONT_END=faust): take_events acks each batch
        after it was forwarded."""
        async for events in stream.take_events(self.batch_size, within=self.batch_window_s):
            await self.ingest_batch([Record.of_faust(event) for event in events])

    async def _lifecycle(self, stream: Any) -> None:
        async for event in stream.events():
            try:
                payload = self._decode(event)
            except RejectedRecord as error:
                await self.dead_letter(Record.of_faust(event), f"undecodable: {error}")
                continue
            transition = convert.transition_from_lifecycle(payload)
            previous = core.JobPlacement.from_json(self.job_placements.get(transition.job_id))
            placement, changes = core.allocation_changes(previous, transition)
            if placement is not None and placement != previous:
                self.job_placements[transition.job_id] = placement.to_json()
            for change in changes:
                await self.node_input.send(
                    key=change.node, value=change.to_json(), partition=self.partition_for(change.node)
                )

    # -- stage 2 ----------------------------------------------------------------------------------

    async def _nodes(self, stream: Any) -> None:
        async for event in stream.events():
            await self._fold(_items(event.value), event.message.partition)
            self._folded[event.message.partition] = event.message.offset
            self._folded_changed.set()

    async def _fold(self, items: Sequence[Json], partition: int) -> None:
        """Stage 2 for one record (a batch of one partition's items): fold each item into its node, then per
        node decide publication and write the table once; publications are awaited together, before the
        record counts as processed (at least once). The node tables' changelog records go out as one batch
        per table (`_write_changelog`)."""
        window_writes: list[tuple[Any, Json]] = []
        before: dict[str, core.NodeRecord | None] = {}
        current: dict[str, core.NodeRecord] = {}
        findings: list[core.IdleFinding] = []
        usage: dict[tuple[str, float], core.WindowAggregate] = {}
        now = self.clock()
        for data in items:
            node = str(data["node"])
            kind = data["kind"]
            if node in current:
                record: core.NodeRecord | None = current[node]
            else:
                record = before[node] = core.NodeRecord.stored(self.node_records.get(node))
            if kind == "readings":
                chunk = core.NodeChunk.from_json(data)
                record, found, usages = core.apply_chunk(record, chunk, self.config)
                findings += found
                self._chunk_metrics(chunk, now)
                window = self._merge_node_window(node, chunk, partition, window_writes)
                node_mean = core.WindowAggregate.from_json(window.get("node")).mean_util_pct
                if node_mean is not None:
                    labelled(metrics.NODE_UTILISATION, node).set(node_mean)
                for share in usages:
                    labelled(metrics.IDLE_GPU_HOURS, share.queue).inc(share.aggregate.idle_gpu_s / 3600.0)
                    for key in (f"job/{share.job_id}", f"queue/{share.queue}"):
                        merged = usage.get((key, share.bucket), core.WindowAggregate()).merge(share.aggregate)
                        usage[(key, share.bucket)] = merged
            elif kind == "inventory":
                record = core.apply_inventory(record, core.Inventory.from_json(data))
            elif kind == "allocation":
                record = core.apply_allocation(record, core.AllocationChange.from_json(data))
            elif kind == "check":
                if record is None:
                    continue
                record = core.check_stale(record, float(data["now"]), self.config.node_timeout_s)
            else:
                log.warning("unknown node-input record", extra={"kind": kind})
                continue
            current[node] = record
        states: list[tuple[str, events_pb2.NodeState, str]] = []
        record_writes: list[tuple[Any, Any]] = []
        records = self.node_records.data  # the store: the changelog records are written below
        for node, record in current.items():
            if core.may_need_publication(before[node], record, now, self.config.publish_interval_s):
                record = self._maybe_publish(record, now, states)
            records[node] = record
            record_writes.append((node, record))
        await self._write_changelog(self.node_records, partition, record_writes)
        await self._write_changelog(self.node_windows.table, partition, window_writes)
        if usage:
            await self._send_items(
                self.usage_topic,
                [
                    (key, {"key": key, "bucket": bucket, "aggregate": aggregate.to_json()})
                    for (key, bucket), aggregate in usage.items()
                ],
            )
        publishing = []
        if states:
            publishing.append(self.producer.publish_many(CLUSTER_STATE, states))
        if findings:
            publishing.append(
                self.producer.publish_many(
                    GPU_IDLE, [(finding.job_id, convert.gpu_idle(finding), finding.event_id) for finding in findings]
                )
            )
        await asyncio.gather(*publishing)
        self.published_states += len(states)
        self.published_idle += len(findings)
        for finding in findings:
            metrics.IDLE_EVENTS.labels(finding.queue).inc()

    def _merge_node_window(
        self, node: str, chunk: core.NodeChunk, partition: int, writes: list[tuple[Any, Json]]
    ) -> Json:
        """What `node_windows[node].apply(merge_node_window, ...)` does (read, merge, store, expiry
        bookkeeping), with the changelog record collected in `writes` instead of sent on its own."""
        table = self.node_windows.table
        value = core.node_window(chunk)
        merged: Json = {}
        for window_range in table.window.ranges(chunk.bucket):
            key = (node, window_range)
            merged = core.merge_node_window(table[key], value)  # table[key]: faust's read (a default when new)
            table.data[key] = merged
            table._maybe_set_key_ttl(key, partition)  # as faust's own write: the window expires
            writes.append((key, merged))
        return merged

    async def _write_changelog(self, table: Any, partition: int, writes: Sequence[tuple[Any, Any]]) -> None:
        """The changelog records faust writes for `table[key] = value`, the same bytes on the same partition,
        but appended to record batches of faust's producer instead of sent one by one through faust's buffer
        (about half of stage 2's cost). Each batch is queued before the next, so a node's records keep their
        order. faust flushes that producer before it commits node-input offsets, so the records are durable
        before the input that made them counts as processed, as before."""
        if not writes:
            return
        topic = table.changelog_topic
        name = topic.get_topic_name()
        batches = RecordBatches(self.app.producer._ensure_producer())  # the aiokafka producer faust flushes on commit
        for key, value in writes:
            key_bytes = topic.prepare_key(key, table.key_serializer)[0]
            value_bytes = topic.prepare_value(value, table.value_serializer)[0]
            await batches.add(name, partition, key_bytes, value_bytes)
        for sent in await batches.send():
            sent.add_done_callback(self._changelog_sent)

    def _changelog_sent(self, sent: asyncio.Future[Any]) -> None:
        if not sent.cancelled() and sent.exception() is not None:
            self._changelog_failure = sent.exception()  # crash_reason: the service stops, not a silent gap

    def _chunk_metrics(self, chunk: core.NodeChunk, now: float) -> None:
        newest = 0.0
        for gpu in chunk.gpus.values():
            newest = max(newest, gpu.last_ts)
            self.samples_applied += gpu.samples
        metrics.STATE_LAG_SECONDS.observe(max(0.0, now - newest))

    def _maybe_publish(
        self, record: core.NodeRecord, now: float, states: list[tuple[str, events_pb2.NodeState, str]]
    ) -> core.NodeRecord:
        view = core.node_view(record)
        self._node_gauges(view)
        if view.last_seen <= 0 and record.inventory is None:
            return record  # nothing to say about a node known only from an allocation
        decided = core.publish_decision(record, view, now, self.config.publish_interval_s)
        if decided is None:
            return record
        states.append(
            (record.node, convert.node_state(view, decided.version, now), f"node-state/{record.node}/{decided.version}")
        )
        return decided

    def _node_gauges(self, view: core.NodeView) -> None:
        """Set whenever the node's view is built: at every placement-relevant change and at least every
        publish interval (per-GPU utilisation is as fresh as cluster.state)."""
        allocated, used = core.allocated_vs_used(view)
        labelled(metrics.NODE_ALLOCATED, view.node).set(allocated)
        labelled(metrics.NODE_USED, view.node).set(used)
        labelled(metrics.NODE_FREE, view.node).set(len(view.free_gpus))
        labelled(metrics.NODE_HEALTHY, view.node).set(1 if view.healthy else 0)
        for gpu in view.gpus:
            labelled(metrics.GPU_UTILISATION, view.node, gpu.uuid).set(gpu.utilization_pct)

    async def _check_stale_nodes(self) -> None:
        now = self.clock()
        for node, stored in list(self.node_records.items()):
            record = core.NodeRecord.stored(stored)
            timeout_s = self.config.node_timeout_s
            if record is not None and not record.stale and core.check_stale(record, now, timeout_s).stale:
                await self.node_input.send(
                    key=node, value={"kind": "check", "node": node, "now": now}, partition=self.partition_for(node)
                )

    # -- stage 3 ----------------------------------------------------------------------------------

    async def _usage(self, stream: Any) -> None:
        async for event in stream.events():
            for data in _items(event.value):
                self._fold_usage(data)

    def _fold_usage(self, data: Json) -> None:
        key = str(data["key"])
        aggregate = data["aggregate"]
        if key.startswith("job/"):
            self.job_windows[key[4:]].apply(core.merge_json, aggregate, _At(data))
            return
        queue = key[6:]
        window = core.WindowAggregate.from_json(
            self.queue_windows[queue].apply(core.merge_json, aggregate, _At(data)).value(_At(data))
        )
        if window.mean_util_pct is not None:
            metrics.QUEUE_UTILISATION.labels(queue).set(window.mean_util_pct)
        metrics.QUEUE_GAP.labels(queue).set((window.allocated_gpu_s - window.used_gpu_s) / self.config.usage_window_s)
