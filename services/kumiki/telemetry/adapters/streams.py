"""The faust-streaming application: three thin agents around the pure core.

  1. ingest      gpu.samples + node.inventory (raw bytes) → kumiki.common.bus.codec.decode → dead-letter the
                 rejects exactly as kumiki.common.bus.consumer does → one NodeChunk per (node, time bucket)
                 per batch → <app>-node-input, keyed by node. (A node's GPUs hash to different partitions
                 of gpu.samples, so node state needs this repartition; chunks keep it to a few records per
                 batch instead of one per sample.)
     lifecycle   job.lifecycle → JobPlacement table (by job) → AllocationChange per node → node-input.
  2. nodes       node-input (by node): NodeRecord table, per-GPU and per-node tumbling windows, cluster.state
                 and gpu.idle through the bus EventProducer, usage per job → <app>-usage keyed by job and queue.
  3. usage       <app>-usage: per-job and per-queue hopping windows, queue gauges.
A timer asks (through node-input, so the node agent's partition owner decides) whether silent nodes are stale.

Tables are faust tables with changelog topics (memory store: a restarted worker rebuilds them from the
changelog). Internal records are JSON; public ones stay protobuf with CloudEvents headers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast

import faust
from aiokafka import AIOKafkaConsumer

from kumiki.common.bus.codec import RejectedRecord, decode
from kumiki.common.bus.metrics import CONSUMED, DEAD_LETTERED
from kumiki.common.bus.producer import EventProducer
from kumiki.common.bus.topics import CLUSTER_STATE, DEAD_LETTER, GPU_IDLE, GPU_SAMPLES, JOB_LIFECYCLE, TopicSpec
from kumiki.common.config import KafkaSettings
from kumiki.common.contracts.v1 import events_pb2
from kumiki.telemetry import core
from kumiki.telemetry.adapters import convert, metrics
from kumiki.telemetry.topics import NODE_INVENTORY

log = logging.getLogger(__name__)

Clock = Callable[[], float]


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
            username=settings.sasl_username, password=settings.sasl_password,
            mechanism=settings.sasl_mechanism, ssl_context=ssl_context,
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
        return cls(message.topic, message.partition, message.offset, message.key, message.value,
                   _header_list(message.headers))


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
        batch_size: int = 10000,
        batch_window_s: float = 0.25,
        clock: Clock = time.time,
        front_end: str = "aiokafka",
        name: str = "telemetry-ingest",
    ) -> None:
        self.settings = settings
        self.config = config
        self.producer = producer
        self.clock = clock
        self.batch_size = batch_size
        self.batch_window_s = batch_window_s
        self.app_id = f"{settings.topic_prefix}{name}"  # consumer group and changelog topic names
        self.front_end = front_end
        self._front: AIOKafkaConsumer | None = None
        self._front_task: asyncio.Task[None] | None = None
        self.samples_seen = 0
        self.dead_lettered = 0
        self.published_states = 0
        self.published_idle = 0
        self.samples_applied = 0  # samples folded into node state (stage 2): what "ingested" means end to end
        self.app: Any = cast(Any, faust.App)(
            self.app_id,
            **faust_broker_options(settings),
            store="memory://",
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
        self.inventory_topic = _raw_topic(self.app, NODE_INVENTORY.full_name(prefix))
        self.lifecycle_topic = _raw_topic(self.app, JOB_LIFECYCLE.full_name(prefix))
        json_topic: dict[str, Any] = {
            "key_serializer": "raw", "value_serializer": "json",
            "internal": True, "partitions": settings.default_partitions,
        }
        self.node_input = self.app.topic(f"{self.app_id}-node-input", **json_topic)
        self.usage_topic = self.app.topic(f"{self.app_id}-usage", **json_topic)

        table: dict[str, Any] = {
            "schema": faust.Schema(key_serializer="json", value_serializer="json"),
            "partitions": settings.default_partitions,
        }
        self.node_records = self.app.Table("node-records", **table)
        self.job_placements = self.app.Table("job-placements", **table)
        expires = timedelta(seconds=config.window_expires_s)
        by_bucket = self._bucket_time
        self.node_windows = self.app.Table("node-windows", default=dict, **table).tumbling(
            config.gpu_window_s, expires=expires).relative_to(by_bucket)
        self.job_windows = self.app.Table("job-windows", default=dict, **table).hopping(
            config.usage_window_s, config.usage_step_s, expires=expires).relative_to(by_bucket)
        self.queue_windows = self.app.Table("queue-windows", default=dict, **table).hopping(
            config.usage_window_s, config.usage_step_s, expires=expires).relative_to(by_bucket)

        if front_end == "faust":
            self.app.agent(self.app.topic(self.samples_topic.get_topic_name(), self.inventory_topic.get_topic_name(),
                                          key_type=bytes, value_type=bytes, key_serializer="raw",
                                          value_serializer="raw"), name="ingest")(self._ingest)
        self.app.agent(self.lifecycle_topic, name="lifecycle")(self._lifecycle)
        self.app.agent(self.node_input, name="nodes")(self._nodes)
        self.app.agent(self.usage_topic, name="usage")(self._usage)
        self.app.timer(max(0.1, config.node_timeout_s / 3), name="stale-nodes")(self._check_stale_nodes)

    @staticmethod
    def _bucket_time(event: Any) -> float:
        return float(event.value["bucket"])

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        await self.app.start()
        if self.front_end == "aiokafka":
            self._front = AIOKafkaConsumer(
                self.samples_topic.get_topic_name(), self.inventory_topic.get_topic_name(),
                **self.settings.client_options(), group_id=f"{self.app_id}-front", enable_auto_commit=False,
                auto_offset_reset="earliest", max_poll_records=self.batch_size,
                session_timeout_ms=int(self.config.session_timeout_s * 1000),
                heartbeat_interval_ms=int(min(3.0, self.config.session_timeout_s / 3) * 1000),
            )
            await self._front.start()
            self._front_task = asyncio.create_task(self._run_front(), name="telemetry-front-end")

    async def stop(self) -> None:
        if self._front_task is not None:
            self._front_task.cancel()
            await asyncio.gather(self._front_task, return_exceptions=True)
        if self._front is not None:
            await self._front.stop()
        await self.app.stop()

    async def _run_front(self) -> None:
        """The aiokafka front end of stage 1: a batch's offsets are committed once its chunks are acknowledged
        (at least once; stage 2 skips a chunk it has already folded in)."""
        assert self._front is not None
        loop = asyncio.get_running_loop()
        previous: asyncio.Task[None] | None = None
        while True:
            # Fill a batch up to batch_size or batch_window_s: bigger batches make bigger node chunks, and
            # stage 2's cost is per chunk.
            records: list[Record] = []
            offsets: dict[Any, int] = {}
            deadline = loop.time() + self.batch_window_s
            while len(records) < self.batch_size:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                batches = await self._front.getmany(timeout_ms=max(1, int(remaining * 1000)),
                                                    max_records=self.batch_size - len(records))
                for partition, partition_records in batches.items():
                    records += [Record(r.topic, r.partition, r.offset, r.key, r.value, list(r.headers or ()))
                                for r in partition_records]
                    offsets[partition] = partition_records[-1].offset + 1
            if not records:
                continue
            sent = await self.ingest_batch(records)
            # Fetch the next batch while this one's chunks are acknowledged; commits stay in batch order.
            if previous is not None and previous.done():
                previous.result()  # a failed commit stops the front end (and readiness)
            previous = asyncio.create_task(self._commit_after(previous, sent, offsets))

    async def _commit_after(self, previous: asyncio.Task[None] | None, sent: list[Any],
                            offsets: dict[Any, int]) -> None:
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
        task = self._front_task
        if task is not None and task.done() and not task.cancelled() and task.exception() is not None:
            return task.exception()
        reason = self.app._crash_reason  # mode keeps why a service crashed here
        return reason if isinstance(reason, BaseException) else None

    # -- stage 1 ----------------------------------------------------------------------------------

    async def dead_letter(self, record: Record, reason: str) -> None:
        headers = dead_letter_headers(record.headers, reason, record.topic, record.partition, record.offset,
                                      self.app_id)
        await self.producer.send_raw(DEAD_LETTER.full_name(self.settings.topic_prefix), record.key,
                                     record.value, headers)
        self.dead_lettered += 1
        DEAD_LETTERED.labels(self.specs[record.topic].name, self.app_id).inc()
        log.warning("dead-lettered record", extra={"topic": record.topic, "offset": record.offset,
                                                   "reason": reason})

    async def ingest_batch(self, records: Sequence[Record]) -> list[Any]:
        """Stage 1 for one batch: decode, dead-letter, summarise, forward. Returns the send futures: the
        caller commits the batch's offsets only once they are all acknowledged."""
        readings: list[core.Reading] = []
        sent: list[Any] = []
        for record in records:
            try:
                payload = decode(self.specs[record.topic], record.key, record.value, record.headers).payload
            except RejectedRecord as error:
                await self.dead_letter(record, f"undecodable: {error}")
                continue
            if isinstance(payload, events_pb2.GpuSample):
                readings.append(convert.reading_from_sample(payload))
            else:
                assert isinstance(payload, events_pb2.NodeState)
                inventory = convert.inventory_from_state(payload)
                sent.append(await self.node_input.send(key=inventory.node, value=inventory.to_json()))
        if readings:
            now = self.clock()
            metrics.SAMPLE_LAG.set(max(0.0, now - max(reading.timestamp for reading in readings)))
            metrics.SAMPLE_LAG_SECONDS.observe(max(0.0, now - min(reading.timestamp for reading in readings)))
            metrics.SAMPLES.inc(len(readings))
            CONSUMED.labels(GPU_SAMPLES.name, self.app_id).inc(len(readings))
            self.samples_seen += len(readings)
            for chunk in core.summarise(readings, self.config.bucket_s):
                sent.append(await self.node_input.send(key=chunk.node, value=chunk.to_json()))
        return sent

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
                await self.node_input.send(key=change.node, value=change.to_json())

    # -- stage 2 ----------------------------------------------------------------------------------

    async def _nodes(self, stream: Any) -> None:
        async for event in stream.events():
            data = event.value
            node = str(data["node"])
            record = core.NodeRecord.stored(self.node_records.get(node))
            kind = data["kind"]
            findings: list[core.IdleFinding] = []
            if kind == "readings":
                chunk = core.NodeChunk.from_json(data)
                record, findings, usages = core.apply_chunk(record, chunk, self.config)
                self.samples_applied += sum(gpu.samples for gpu in chunk.gpus.values())
                newest = max(gpu.last_ts for gpu in chunk.gpus.values())
                metrics.STATE_LAG_SECONDS.observe(max(0.0, self.clock() - newest))
                window = self.node_windows[node].apply(core.merge_node_window, core.node_window(chunk), event)
                node_mean = core.WindowAggregate.from_json(window.value(event).get("node")).mean_util_pct
                if node_mean is not None:
                    metrics.NODE_UTILISATION.labels(node).set(node_mean)
                for usage in usages:
                    metrics.IDLE_GPU_HOURS.labels(usage.queue).inc(usage.aggregate.idle_gpu_s / 3600.0)
                    for key in (f"job/{usage.job_id}", f"queue/{usage.queue}"):
                        await self.usage_topic.send(key=key, value={"key": key, **usage.to_json()})
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
            for finding in findings:
                await self.producer.publish(GPU_IDLE, finding.job_id, convert.gpu_idle(finding),
                                            event_id=finding.event_id)
                self.published_idle += 1
                metrics.IDLE_EVENTS.labels(finding.queue).inc()
            record = await self._maybe_publish(record)
            self.node_records[node] = record  # serialised by faust's JSON codec (NodeRecord.__json__)

    async def _maybe_publish(self, record: core.NodeRecord) -> core.NodeRecord:
        view = core.node_view(record)
        self._node_gauges(view)
        if view.last_seen <= 0 and record.inventory is None:
            return record  # nothing to say about a node known only from an allocation
        now = self.clock()
        decided = core.publish_decision(record, view, now, self.config.publish_interval_s)
        if decided is None:
            return record
        await self.producer.publish(CLUSTER_STATE, record.node, convert.node_state(view, decided.version, now),
                                    event_id=f"node-state/{record.node}/{decided.version}")
        self.published_states += 1
        return decided

    @staticmethod
    def _node_gauges(view: core.NodeView) -> None:
        allocated, used = core.allocated_vs_used(view)
        metrics.NODE_ALLOCATED.labels(view.node).set(allocated)
        metrics.NODE_USED.labels(view.node).set(used)
        metrics.NODE_FREE.labels(view.node).set(len(view.free_gpus))
        metrics.NODE_HEALTHY.labels(view.node).set(1 if view.healthy else 0)
        for gpu in view.gpus:
            metrics.GPU_UTILISATION.labels(view.node, gpu.uuid).set(gpu.utilization_pct)

    async def _check_stale_nodes(self) -> None:
        now = self.clock()
        for node, stored in list(self.node_records.items()):
            record = core.NodeRecord.stored(stored)
            timeout_s = self.config.node_timeout_s
            if record is not None and not record.stale and core.check_stale(record, now, timeout_s).stale:
                await self.node_input.send(key=node, value={"kind": "check", "node": node, "now": now})

    # -- stage 3 ----------------------------------------------------------------------------------

    async def _usage(self, stream: Any) -> None:
        async for event in stream.events():
            data = event.value
            key = str(data["key"])
            aggregate = data["aggregate"]
            if key.startswith("job/"):
                self.job_windows[key[4:]].apply(core.merge_json, aggregate, event)
                continue
            queue = key[6:]
            window = core.WindowAggregate.from_json(
                self.queue_windows[queue].apply(core.merge_json, aggregate, event).value(event))
            if window.mean_util_pct is not None:
                metrics.QUEUE_UTILISATION.labels(queue).set(window.mean_util_pct)
            metrics.QUEUE_GAP.labels(queue).set(
                (window.allocated_gpu_s - window.used_gpu_s) / self.config.usage_window_s)
