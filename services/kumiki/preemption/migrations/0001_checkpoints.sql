-- The checkpoint registry: the newest acknowledged checkpoint of every job.
CREATE TABLE checkpoints (
    job_id       text        NOT NULL PRIMARY KEY,
    generation   bigint      NOT NULL,
    uri          text        NOT NULL,
    step         bigint      NOT NULL,
    completed_at timestamptz NOT NULL,
    reported_at  timestamptz NOT NULL DEFAULT now()
);
