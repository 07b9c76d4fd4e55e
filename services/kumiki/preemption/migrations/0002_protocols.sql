-- The preemption protocol of every victim (one row per job attempt), and the effects still to carry out.
-- A protocol's row and the effects of its transition are written in one transaction (an outbox): after a
-- crash the coordinator carries out every effect whose done_at is null, at least once; effects are idempotent.
CREATE TABLE protocols (
    job_id                 text             NOT NULL,
    generation             bigint           NOT NULL,
    queue                  text             NOT NULL,
    gpus                   double precision NOT NULL,
    reason                 text             NOT NULL,
    decision_id            text             NOT NULL,
    beneficiary            text             NOT NULL,
    beneficiary_generation bigint           NOT NULL,
    phase                  text             NOT NULL,
    requested_unix_s       double precision NOT NULL,
    deadline_unix_s        double precision NOT NULL,
    bound_unix_s           double precision NOT NULL,
    checkpoint_uri         text             NOT NULL DEFAULT '',
    checkpoint_step        bigint           NOT NULL DEFAULT 0,
    checkpoint_unix_s      double precision NOT NULL DEFAULT 0,
    acked_unix_s           double precision NOT NULL DEFAULT 0,
    evicted_unix_s         double precision NOT NULL DEFAULT 0,
    forced                 boolean          NOT NULL DEFAULT false,
    lost_gpu_seconds       double precision NOT NULL DEFAULT 0,
    resume_generation      bigint           NOT NULL DEFAULT 0,
    assignments            bytea            NOT NULL DEFAULT '',
    updated_at             timestamptz      NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, generation)
);
CREATE INDEX protocols_open ON protocols (phase, deadline_unix_s) WHERE phase IN ('checkpointing', 'evicting', 'requeued');

CREATE TABLE outbox (
    id          bigserial   PRIMARY KEY,
    job_id      text        NOT NULL,
    generation  bigint      NOT NULL,
    kind        text        NOT NULL,  -- 'command' (publish + Watch), 'release' (Placement.Release), 'checkpoint'
    action      text        NOT NULL DEFAULT '',
    command_id  text        NOT NULL DEFAULT '',
    lost_gpu_seconds double precision NOT NULL DEFAULT 0,
    payload     bytea       NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL DEFAULT now(),
    done_at     timestamptz
);
CREATE INDEX outbox_pending ON outbox (id) WHERE done_at IS NULL;
