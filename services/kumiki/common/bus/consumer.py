"""Consuming events: offsets are committed only after the handler succeeded, bad records are dead-lettered.

Two ways to keep offsets:
- in Kafka (default): commit after the handler; a crash in between redelivers, so handlers must be
  idempotent (they are: dedupe by ce_id here, and by entity version in the services);
- in Postgres (`pool=`): the offsets are written in the same transaction as the handler's own writes,
  so side effects in Postgres happen exactly once across crashes and restarts. The stored offset is the only
  word on what was applied: a batch that starts past it, or an idle position past it (a database that lost
  its last commits in a crash, as one with synchronous_commit off does), sends the consumer back to it.

A record that cannot be decoded, fails validation, or whose handler raises `EventRejected` goes to the
dead-letter topic with the reason in the `kumiki_dlq_reason` header, and the consumer carries on. A
handler that raises anything else is retried, then dead-lettered; infrastructure errors (database or
broker down) stop the consumer without committing, so nothing is lost.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Sequence

import asyncpg
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import IllegalStateError, KafkaError
from aiokafka.structs import ConsumerRecord
from opentelemetry import trace

from kumiki.common.bus.admin import start_client
from kumiki.common.bus.codec import Event, RejectedRecord, decode
from kumiki.common.bus.metrics import CONSUMED, DEAD_LETTERED, DUPLICATES, GAPS, HANDLER_SECONDS, REDELIVERED
from kumiki.common.bus.producer import EventProducer
from kumiki.common.bus.topics import DEAD_LETTER, TopicSpec
from kumiki.common.config import KafkaSettings
from kumiki.common.db import UNREACHABLE
from kumiki.common.metrics import labelled
from kumiki.common.tracing import extract_context, process_attributes

log = logging.getLogger(__name__)
tracer = trace.get_tracer("kumiki.bus")

Handler = Callable[[Event, asyncpg.Connection | None], Awaitable[None]]
VERIFY_EVERY_S = 2.0  # how often an idle transactional consumer compares its positions with the stored offsets
INFRASTRUCTURE_ERRORS = (*UNREACHABLE, KafkaError)


def dead_letter_headers(
    headers: Sequence[tuple[str, bytes]], reason: str, topic: str, partition: int, offset: int, group: str
) -> list[tuple[str, bytes]]:
    """A dead letter's headers: the record's own, then why and where it was rejected, so a dead letter reads
    alike whichever consumer (this one, telemetry's stage 1) rejected it."""
    return [
        *headers,
        ("kumiki_dlq_reason", reason.encode()),
        ("kumiki_dlq_topic", topic.encode()),
        ("kumiki_dlq_partition", str(partition).encode()),
        ("kumiki_dlq_offset", str(offset).encode()),
        ("kumiki_dlq_group", group.encode()),
    ]


class EventRejected(Exception):
    """Raised by a handler for an event it can never apply (unknown queue, impossible value)."""


class _SeekToStoredOffsets(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, owner: EventConsumer) -> None:
        self.owner = owner

    # The going back is forgotten on both sides of a rebalance: revoked comes before any new position exists,
    # assigned covers a partition the revoke did not name (a member dropped from its group rejoins afresh).
    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        self.owner._forget_going_back(revoked)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        self.owner._forget_going_back(assigned)
        try:
            await self.owner._seek_to_stored(assigned)
        except UNREACHABLE as error:  # the client would log it and go on all the same
            log.warning(
                "could not read the stored offsets on assignment: the positions are Kafka's committed offsets,"
                " and the first batch checked against a stored offset sends the consumer back to it",
                extra={"group": self.owner.group_id, "error": repr(error)},
            )


class EventConsumer:
    def __init__(
        self,
        settings: KafkaSettings,
        specs: Sequence[TopicSpec],
        group_id: str,
        handler: Handler,
        producer: EventProducer,
        *,
        pool: asyncpg.Pool | None = None,
        max_attempts: int = 3,
        batch_size: int = 500,
        dedupe_window: int = 100_000,
    ) -> None:
        self.settings = settings
        self.group_id = group_id
        self.handler = handler
        self.producer = producer
        self.pool = pool
        self.max_attempts = max_attempts
        self.batch_size = batch_size
        self.dedupe_window = dedupe_window
        self._specs = {spec.full_name(settings.topic_prefix): spec for spec in specs}
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._gap_checked: dict[TopicPartition, int] = {}  # partition -> the stored offset gone back to once
        self._verified_at = 0.0
        self._stopping = asyncio.Event()
        self.assigned = asyncio.Event()
        self.handled = 0
        self.dead_lettered = 0
        self._consumer = AIOKafkaConsumer(
            *self._specs,
            **settings.client_options(),
            group_id=group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            max_poll_records=batch_size,
        )

    async def start(self) -> None:
        listener = _SeekToStoredOffsets(self)
        self._consumer.subscribe(list(self._specs), listener=listener)
        await start_client(self._consumer, self.settings)

    async def stop(self) -> None:
        self._stopping.set()
        await self._consumer.stop()

    def request_stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        """Consume until stopped; infrastructure errors propagate (nothing uncommitted is lost)."""
        while not self._stopping.is_set():
            batches = await self._consumer.getmany(timeout_ms=200, max_records=self.batch_size)
            if self.pool is None and self._consumer.assignment():
                self.assigned.set()
            if self.pool is not None and not batches:
                await self._verify_positions()
            for partition, records in batches.items():
                if self._stopping.is_set():
                    return
                if self.pool is None:
                    await self._process_committing_to_kafka(partition, records)
                else:
                    await self._process_in_transaction(partition, records)

    async def _stored_offsets(self) -> dict[TopicPartition, int]:
        assert self.pool is not None
        rows = await self.pool.fetch(
            "SELECT topic, partition, next_offset FROM kumiki_bus.consumer_offsets WHERE group_id = $1",
            self.group_id,
        )
        return {TopicPartition(row["topic"], row["partition"]): row["next_offset"] for row in rows}

    async def _seek_to_stored(self, assigned: list[TopicPartition]) -> None:
        """Positions every assigned partition at its Postgres-stored offset; `assigned` is set once they are."""
        if self.pool is None or not assigned:
            self.assigned.set()
            return
        stored = await self._stored_offsets()
        for partition in assigned:
            if partition in stored:
                self._consumer.seek(partition, stored[partition])
            else:
                await self._consumer.seek_to_beginning(partition)
        self.assigned.set()

    async def _process_committing_to_kafka(self, partition: TopicPartition, records: list[ConsumerRecord]) -> None:
        handled: set[str] = set()
        for record in records:
            await self._process_one(record, None, handled)
        await self._consumer.commit({partition: records[-1].offset + 1})
        self._remember(handled)

    async def _process_in_transaction(self, partition: TopicPartition, records: list[ConsumerRecord]) -> None:
        """The batch and its next offset in one transaction. The stored offset, locked for the transaction, is
        checked against the batch: records before it were applied already (a redelivery after a rebalance, or
        another member of the group got there first) and are skipped by offset; a batch that starts after it
        means records this process applied are not in the database any more (it lost its last commits in a
        crash) or the client's position jumped past them, so the consumer goes back for them once per
        assignment, and accepts the jump only when the broker hands the same batch again (a compacted or expired
        range has no records)."""
        assert self.pool is not None
        handled: set[str] = set()
        async with self.pool.acquire() as connection, connection.transaction():
            stored = await connection.fetchval(
                "SELECT next_offset FROM kumiki_bus.consumer_offsets"
                " WHERE group_id = $1 AND topic = $2 AND partition = $3 FOR UPDATE",
                self.group_id,
                partition.topic,
                partition.partition,
            )
            if stored is not None:
                fresh = [record for record in records if record.offset >= stored]
                if len(fresh) < len(records):
                    labelled(REDELIVERED, self._specs[partition.topic].name, self.group_id).inc(
                        len(records) - len(fresh)
                    )
                records = fresh
                if not records:
                    return
                if records[0].offset > stored and self._go_back_once(partition, stored, records[0].offset):
                    return
            for record in records:
                await self._process_one(record, connection, handled)
            await connection.execute(
                "INSERT INTO kumiki_bus.consumer_offsets (group_id, topic, partition, next_offset)"
                " VALUES ($1, $2, $3, $4) ON CONFLICT (group_id, topic, partition)"
                " DO UPDATE SET next_offset = EXCLUDED.next_offset, updated_at = now()",
                self.group_id,
                partition.topic,
                partition.partition,
                records[-1].offset + 1,
            )
        self._remember(handled)  # only once committed: a rolled-back batch's events are not duplicates
        try:  # for lag monitoring only: the Postgres row is the truth
            await self._consumer.commit({partition: records[-1].offset + 1})
        except KafkaError as error:
            log.warning("kafka offset commit failed (postgres offsets are authoritative)", extra={"error": str(error)})

    async def _verify_positions(self) -> None:
        """While idle (every VERIFY_EVERY_S at most): a partition whose position is past its stored offset had
        batches the database no longer holds (a Postgres that lost its last commits, as one with
        synchronous_commit off does when it crashes), and no new record would reveal the gap: go back."""
        now = time.monotonic()
        if now < self._verified_at + VERIFY_EVERY_S:
            return
        self._verified_at = now
        assert self.pool is not None
        assigned = self._consumer.assignment()
        if not assigned:
            return
        stored = await self._stored_offsets()
        for partition in assigned:
            try:
                position = await self._consumer.position(partition)
            except IllegalStateError:
                continue  # revoked meanwhile
            kept = stored.get(partition, 0)
            if kept < position:
                self._go_back_once(partition, kept, position)

    def _forget_going_back(self, partitions: Iterable[TopicPartition]) -> None:
        """A rebalance gives a partition a new position (Kafka's committed offset, which runs ahead of a stored
        offset Postgres lost), and it can be handed out before the listener's seek to the stored offset lands:
        a batch past the stored offset after a rebalance says nothing about the range, so go back again."""
        for partition in partitions:
            self._gap_checked.pop(partition, None)

    def _go_back_once(self, partition: TopicPartition, stored: int, ahead: int) -> bool:
        """Seek to the stored offset, once per stored offset and assignment (False: already gone back there since
        the partition was assigned, so the fetch from the stored offset found no records before `ahead`). What
        this process remembers as seen is forgotten too: those events may be exactly the ones the database lost,
        and only the stored offset says what was applied."""
        if self._gap_checked.get(partition) == stored:
            return False
        self._gap_checked[partition] = stored
        log.warning(
            "consumer is past the stored offset: going back for the records in between",
            extra={"topic": partition.topic, "partition": partition.partition, "stored": stored, "at": ahead},
        )
        labelled(GAPS, self._specs[partition.topic].name, self.group_id).inc()
        self._seen.clear()
        if partition in self._consumer.assignment():  # revoked meanwhile: its next owner seeks to the stored offset
            self._consumer.seek(partition, stored)
        return True

    async def _process_one(
        self, record: ConsumerRecord, connection: asyncpg.Connection | None, handled: set[str]
    ) -> None:
        """`handled`: the ids of this batch's events handled so far, remembered as seen once the batch is kept."""
        spec = self._specs[record.topic]
        headers = list(record.headers or ())
        try:
            event = decode(spec, record.key, record.value, headers)
        except RejectedRecord as error:
            await self._dead_letter(record, f"undecodable: {error}")
            return
        event = Event(event.topic, event.key, event.payload, event.attributes, headers, record.partition, record.offset)
        if event.attributes.id in self._seen or event.attributes.id in handled:
            labelled(DUPLICATES, spec.name, self.group_id).inc()
            return
        with tracer.start_as_current_span(
            f"process {record.topic}",
            context=extract_context(headers),
            kind=trace.SpanKind.CONSUMER,
            attributes=process_attributes(record.topic, self.group_id, record.partition, record.offset, record.key),
        ) as span:
            span.set_attribute("messaging.message.id", event.attributes.id)
            reason = await self._call_handler(event, connection)
        if reason is not None:
            await self._dead_letter(record, reason)
            return
        handled.add(event.attributes.id)
        self.handled += 1
        labelled(CONSUMED, spec.name, self.group_id).inc()

    async def _call_handler(self, event: Event, connection: asyncpg.Connection | None) -> str | None:
        """None when handled; the dead-letter reason otherwise."""
        for attempt in range(1, self.max_attempts + 1):
            started = time.perf_counter()
            try:
                if connection is None:
                    await self.handler(event, None)
                else:
                    async with connection.transaction():  # a savepoint: a failed event leaves no trace
                        await self.handler(event, connection)
                return None
            except EventRejected as error:
                return f"rejected: {error}"
            except INFRASTRUCTURE_ERRORS:
                raise
            except Exception as error:  # a handler bug must not block the partition forever
                log.warning(
                    "handler failed", extra={"attempt": attempt, "ce_id": event.attributes.id, "error": repr(error)}
                )
                if attempt == self.max_attempts:
                    return f"handler failed after {attempt} attempts: {error!r}"
                await asyncio.sleep(0.05 * 2**attempt)
            finally:
                labelled(HANDLER_SECONDS, event.topic.name, self.group_id).observe(time.perf_counter() - started)
        return None

    def _remember(self, event_ids: set[str]) -> None:
        for event_id in event_ids:
            self._seen[event_id] = None
        while len(self._seen) > self.dedupe_window:
            self._seen.popitem(last=False)

    async def _dead_letter(self, record: ConsumerRecord, reason: str) -> None:
        headers = dead_letter_headers(
            record.headers or (), reason, record.topic, record.partition, record.offset, self.group_id
        )
        await self.producer.send_raw(
            DEAD_LETTER.full_name(self.settings.topic_prefix), record.key, record.value, headers
        )
        self.dead_lettered += 1
        DEAD_LETTERED.labels(self._specs[record.topic].name, self.group_id).inc()
        log.warning("dead-lettered record", extra={"topic": record.topic, "offset": record.offset, "reason": reason})
