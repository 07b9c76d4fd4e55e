-- Consumer offsets stored in the same transaction as a handler's side effects (exactly-once consumers).
CREATE TABLE consumer_offsets (
    group_id    text        NOT NULL,
    topic       text        NOT NULL,
    partition   integer     NOT NULL,
    next_offset bigint      NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_id, topic, partition)
);
