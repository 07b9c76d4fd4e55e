-- Job history for learning run times: one row per job attempt, written exactly once from job.lifecycle
-- (the consumer's offsets are stored in the same transaction, kumiki_bus.consumer_offsets).
CREATE TABLE job_history (
    job_id       text             NOT NULL,
    generation   bigint           NOT NULL,
    queue        text             NOT NULL,
    user_name    text             NOT NULL DEFAULT '',
    name         text             NOT NULL DEFAULT '',
    gpus         double precision NOT NULL,
    submitted_at timestamptz      NOT NULL,
    finished_at  timestamptz,
    final_state  text,
    runtime_s    double precision,
    p50_s        double precision,
    p90_s        double precision,
    model        text,
    PRIMARY KEY (job_id, generation)
);
CREATE INDEX job_history_finished ON job_history (finished_at) WHERE finished_at IS NOT NULL;
