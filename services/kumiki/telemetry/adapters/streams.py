"""The faust-streaming application: three thin agents around the pure core.

  1. ingest      gpu.samples + node.inventory (raw bytes) → kumiki.common.bus.codec.decode → dead-letter the
                 rejects exactly as kumiki.common.bus.consumer does, and the samples of unregistered nodes
                 (KnownNodes) → one NodeChunk per (node, time bucket) per batch → <app>-node-input, one record
                 per partition holding many nodes' items (partition = Kafka's default partitioner on the node
                 name, so tables stay co-partitioned). The aiokafka front end (`front_end.py`) keeps at most
                 two batches in stage 2; the faust one is the `ingest` agent.
     lifecycle   job.lifecycle → JobPlacement table (by job) → AllocationChange per node → node-input.
  2. nodes       node-input: NodeRecord table (one write per node per record), per-GPU and per-node tumbling
                 windows, cluster.state, gpu.idle and gpu.busy through the bus EventProducer (awaited together per
                 record), usage per job and queue → <app>-usage in batch records. The two node tables'
                 changelog records go out in record batches of faust's producer (`changelog.py`).
  3. usage       <app>-usage: per-job and per-queue hopping windows, queue gauges.
A timer asks (through node-input, so the node agent's partition owner decides) whether silent nodes are stale.

Tables are faust tables with changelog topics (memory store: a restarted worker rebuilds them from the
changelog; the app's settings are in `faust_app.py`). Internal records are JSON; public ones stay protobuf with
CloudEvents headers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import faust
from aiokafka import TopicPartition
from aiokafka.partitioner import murmur2

from kumiki.common.bus.codec import RejectedRecord, decode
from kumiki.common.bus.consumer import dead_letter_headers
from kumiki.common.bus.metrics import CONSUMED, DEAD_LETTERED
from kumiki.common.bus.producer import EventProducer
from kumiki.common.bus.topics import (
    CLUSTER_STATE,
    DEAD_LETTER,
    GPU_BUSY,
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
from kumiki.telemetry.adapters.agent_identity import AgentIdentity
from kumiki.telemetry.adapters.changelog import ChangelogWriter, apply_node_window
from kumiki.telemetry.adapters.codecs import NodeRecordJson
from kumiki.telemetry.adapters.commits import CommitWatch
from kumiki.telemetry.adapters.consumed import Consumed, Record
from kumiki.telemetry.adapters.faust_app import raw_topic, telemetry_app
from kumiki.telemetry.adapters.front_end import FlowControl, FrontEnd
from kumiki.telemetry.adapters.known_nodes import KnownNodes
from kumiki.telemetry.adapters.samples import FastSamples
from kumiki.telemetry.core import Json

log = logging.getLogger(__name__)

Clock = Callable[[], float]

# Internal records carry many items (one per node chunk, inventory, usage key) per partition: stage 2's cost
# is per faust event, and live chunks are small. The cap keeps a record far below the broker's 1 MB limit.
MAX_ITEMS_PER_RECORD = 100


@dataclass(frozen=True, slots=True)
class _At:
    """What a windowed table reads an item's time from (`_bucket_time`): one record holds many items, each
    with its own bucket, while the changelog partition still comes from the record being processed."""

    value: Json


def _items(data: Json) -> list[Json]:
    return list(data["items"]) if data.get("kind") == "batch" else [data]


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
        agent_identity: AgentIdentity | None = None,
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
        self.samples_seen = 0
        self.dead_lettered = 0
        self.published_states = 0
        self.samples_applied = 0  # samples folded into node state (stage 2): what "ingested" means end to end
        self.unknown_rejected = 0
        self.partitions = settings.default_partitions
        self._partition_of: dict[str, int] = {}
        self.flow = FlowControl(self.batch_window_s)  # stage 2 reports what it folded, the front end waits on it
        self.commit_stall_s = commit_stall_s  # 0: no watch on the group's commits
        self.agent_identity = agent_identity  # None: any agent may name any node (no agent's proof required)
        self.commits: CommitWatch | None = None
        self.known_nodes = KnownNodes(settings, (NODE_INVENTORY, CLUSTER_STATE))
        self.app: Any = telemetry_app(self.app_id, settings, config, batch_size)
        self.changelog = ChangelogWriter(self.app)
        prefix = settings.topic_prefix
        self.specs: dict[str, TopicSpec] = {
            spec.full_name(prefix): spec for spec in (GPU_SAMPLES, NODE_INVENTORY, JOB_LIFECYCLE)
        }
        self.samples_topic = raw_topic(self.app, GPU_SAMPLES.full_name(prefix))
        self._samples_topic_name = GPU_SAMPLES.full_name(prefix)
        self._fast_samples = FastSamples()
        self.inventory_topic = raw_topic(self.app, NODE_INVENTORY.full_name(prefix))
        self.lifecycle_topic = raw_topic(self.app, JOB_LIFECYCLE.full_name(prefix))
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

        self.front: FrontEnd | None = None  # stage 1 on aiokafka; on faust, the `ingest` agent
        if front_end == "aiokafka":
            self.front = FrontEnd(
                settings,
                config,
                (self.samples_topic.get_topic_name(), self.inventory_topic.get_topic_name()),
                f"{self.app_id}-front",
                self.ingest_batch,
                self.flow,
                batch_size=self.batch_size,
                batch_window_s=self.batch_window_s,
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
        self.app.on_partitions_revoked.connect(self.flow.forget)
        await self.app.start()
        if self.front is not None:
            await self.front.start()
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
        if self.front is not None:
            await self.front.stop()
        await self.app.stop()
        await self.known_nodes.stop()
        if self.agent_identity is not None:
            await self.agent_identity.close()

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

    @property
    def flow_waits(self) -> int:
        """How many of stage 1's batches waited for this worker's stage 2 (flow control)."""
        return self.flow.waits

    @property
    def recovered(self) -> bool:
        """True once the tables are rebuilt from their changelogs for the current assignment."""
        return bool(self.app.tables.recovery.completed.is_set())

    async def wait_recovered(self, timeout_s: float) -> None:
        await asyncio.wait_for(self.app.tables.recovery.completed.wait(), timeout_s)

    def crash_reason(self) -> BaseException | None:
        if self.changelog.failure is not None:
            return self.changelog.failure
        if self.commits is not None and self.commits.failure is not None:
            return self.commits.failure
        if self.front is not None and self.front.failure is not None:
            return self.front.failure
        reason = self.app._crash_reason  # mode keeps why a service crashed here
        return reason if isinstance(reason, BaseException) else None

    # -- stage 1 ----------------------------------------------------------------------------------

    async def dead_letter(self, record: Consumed, reason: str) -> None:
        kept = [(name, value) for name, value in record.headers or () if name != core.AGENT_TOKEN_HEADER]
        # an agent's token is a credential: it never leaves for the dead-letter topic, which more users read
        headers = dead_letter_headers(kept, reason, record.topic, record.partition, record.offset, self.app_id)
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
        inventories: list[tuple[Consumed, core.Inventory]] = []
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
                inventories.append((record, convert.inventory_from_state(payload)))
        if self.agent_identity is not None:
            sampled, readings, inventories = await self._from_their_agents(sampled, readings, inventories)
        for _, inventory in inventories:
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

    async def _from_their_agents(
        self,
        sampled: list[Consumed],
        readings: list[core.Reading],
        inventories: list[tuple[Consumed, core.Inventory]],
    ) -> tuple[list[Consumed], list[core.Reading], list[tuple[Consumed, core.Inventory]]]:
        """The records whose agent's proof (token or signature) holds for the node they name; the others go to
        the dead-letter topic, original bytes intact, with the reason."""
        assert self.agent_identity is not None
        claims = [
            (reading.node, record.headers, record.value or b"")
            for record, reading in zip(sampled, readings, strict=True)
        ]
        claims += [(inventory.node, record.headers, record.value or b"") for record, inventory in inventories]
        reasons = await self.agent_identity.refusals(claims)
        if not any(reasons):
            return sampled, readings, inventories
        records = [*sampled, *(record for record, _ in inventories)]
        await asyncio.gather(
            *(self.dead_letter(record, reason) for record, reason in zip(records, reasons, strict=True) if reason)
        )
        sample_reasons, inventory_reasons = reasons[: len(sampled)], reasons[len(sampled) :]
        kept = [i for i, reason in enumerate(sample_reasons) if reason is None]
        return (
            [sampled[i] for i in kept],
            [readings[i] for i in kept],
            [item for item, reason in zip(inventories, inventory_reasons, strict=True) if reason is None],
        )

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
            self.flow.fold(event.message.partition, event.message.offset)

    async def _fold(self, items: Sequence[Json], partition: int) -> None:
        """Stage 2 for one record (a batch of one partition's items): fold each item into its node, then per
        node decide publication and write the table once; publications are awaited together, before the
        record counts as processed (at least once). The node tables' changelog records go out as one batch
        per table (`ChangelogWriter`)."""
        window_writes: list[tuple[Any, Json]] = []
        before: dict[str, core.NodeRecord | None] = {}
        current: dict[str, core.NodeRecord] = {}
        findings: list[core.GpuFinding] = []
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
                window = apply_node_window(self.node_windows.table, node, chunk, partition, window_writes)
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
        await self.changelog.write(self.node_records, partition, record_writes)
        await self.changelog.write(self.node_windows.table, partition, window_writes)
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
        idle: list[core.GpuFinding] = [finding for finding in findings if isinstance(finding, core.IdleFinding)]
        busy: list[core.GpuFinding] = [finding for finding in findings if isinstance(finding, core.BusyFinding)]
        for topic, found in ((GPU_IDLE, idle), (GPU_BUSY, busy)):
            if found:
                events = [(finding.job_id, convert.gpu_finding(finding), finding.event_id) for finding in found]
                publishing.append(self.producer.publish_many(topic, events))
        await asyncio.gather(*publishing)
        self.published_states += len(states)
        for counter, found in ((metrics.IDLE_EVENTS, idle), (metrics.BUSY_EVENTS, busy)):
            for finding in found:
                counter.labels(finding.queue).inc()

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
        metrics.node_gauges(view)
        if view.last_seen <= 0 and record.inventory is None:
            return record  # nothing to say about a node known only from an allocation
        decided = core.publish_decision(record, view, now, self.config.publish_interval_s)
        if decided is None:
            return record
        states.append(
            (record.node, convert.node_state(view, decided.version, now), f"node-state/{record.node}/{decided.version}")
        )
        return decided

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
