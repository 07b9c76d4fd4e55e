-- The queue tree, the cluster's capacity and GPU prices: replaced whole by `kumiki quota load`.
CREATE TABLE config_version (
    singleton  boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    version    bigint      NOT NULL,
    source     text        NOT NULL,
    loaded_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE queues (
    path            text             PRIMARY KEY,
    parent          text             REFERENCES queues (path) DEFERRABLE INITIALLY DEFERRED,
    depth           integer          NOT NULL,
    limit_gpus      double precision,
    weight          double precision NOT NULL CHECK (weight > 0),
    priority_tiers  integer[]        NOT NULL DEFAULT '{}',
    owners          text[]           NOT NULL DEFAULT '{}'
);

CREATE TABLE guarantees (
    path       text             NOT NULL REFERENCES queues (path) ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED,
    gpu_model  text             NOT NULL,  -- '' = any model
    gpus       double precision NOT NULL CHECK (gpus >= 0),
    PRIMARY KEY (path, gpu_model)
);

-- One row per GPU model: admissions that depend on idle capacity lock it (SELECT ... FOR UPDATE).
CREATE TABLE capacity (
    gpu_model  text             PRIMARY KEY,
    gpus       double precision NOT NULL CHECK (gpus >= 0)
);

CREATE TABLE cluster_resources (
    singleton   boolean          PRIMARY KEY DEFAULT true CHECK (singleton),
    cpu_milli   double precision NOT NULL,
    memory_mib  double precision NOT NULL
);

CREATE TABLE gpu_rates (
    gpu_model          text    PRIMARY KEY,
    rate_per_gpu_hour  numeric NOT NULL CHECK (rate_per_gpu_hour >= 0)
);

-- Admitted work holding quota, until job.lifecycle says it ended.
CREATE TABLE holdings (
    job_id          text             PRIMARY KEY,
    generation      bigint           NOT NULL,
    queue           text             NOT NULL,
    gpu_model       text             NOT NULL,
    gpus            double precision NOT NULL,
    priority_tier   integer          NOT NULL,
    preemptible     boolean          NOT NULL,
    borrowed        boolean          NOT NULL,
    reclaiming      boolean          NOT NULL DEFAULT false,
    seq             bigserial,
    identity        text             NOT NULL,
    admitted_at     timestamptz      NOT NULL DEFAULT now()
);
CREATE INDEX holdings_queue ON holdings (queue);

-- Reclaim decisions, written in the admission's transaction and published afterwards (an outbox).
CREATE TABLE reclaim_decisions (
    decision_id             text        PRIMARY KEY,
    victim_job              text        NOT NULL,
    victim_generation       bigint      NOT NULL,
    victim_queue            text        NOT NULL,
    gpus                    double precision NOT NULL,
    beneficiary_job         text        NOT NULL,
    beneficiary_generation  bigint      NOT NULL,
    beneficiary_queue       text        NOT NULL,
    created_at              timestamptz NOT NULL DEFAULT now(),
    published_at            timestamptz
);
CREATE INDEX reclaim_decisions_unpublished ON reclaim_decisions (created_at) WHERE published_at IS NULL;

-- The meter: one open interval per (job, generation) while it runs.
CREATE TABLE open_intervals (
    job_id         text    NOT NULL,
    generation     bigint  NOT NULL,
    queue          text    NOT NULL,
    gpu_model      text    NOT NULL,
    priority_tier  integer NOT NULL,
    gpus           numeric NOT NULL,
    cpu_milli      double precision NOT NULL DEFAULT 0,
    memory_mib     double precision NOT NULL DEFAULT 0,
    start_us       bigint  NOT NULL,
    PRIMARY KEY (job_id, generation)
);

-- The ledger: one closed interval per (job, generation); GPU-seconds exact (numeric, microseconds).
CREATE TABLE ledger (
    job_id         text    NOT NULL,
    generation     bigint  NOT NULL,
    queue          text    NOT NULL,
    gpu_model      text    NOT NULL,
    priority_tier  integer NOT NULL,
    gpus           numeric NOT NULL,
    cpu_milli      double precision NOT NULL DEFAULT 0,
    memory_mib     double precision NOT NULL DEFAULT 0,
    start_us       bigint  NOT NULL,
    end_us         bigint  NOT NULL CHECK (end_us >= start_us),
    gpu_seconds    numeric NOT NULL,
    final_state    integer NOT NULL,
    event_id       text    NOT NULL,
    PRIMARY KEY (job_id, generation)
);
CREATE INDEX ledger_end ON ledger (end_us);
CREATE INDEX ledger_queue ON ledger (queue, end_us);
