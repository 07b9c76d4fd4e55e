-- Work lost by preemption: the GPU-seconds an evicted attempt computed after its last acknowledged checkpoint
-- (kumiki.job.lifecycle PREEMPTED, lost_gpu_seconds). Its own entry kind, beside the metered intervals: the
-- lost GPU-seconds were metered (and billed) already; this says how much of them was wasted.
CREATE TABLE lost_work (
    job_id           text    NOT NULL,
    generation       bigint  NOT NULL,
    queue            text    NOT NULL,
    gpu_model        text    NOT NULL,
    lost_gpu_seconds numeric NOT NULL CHECK (lost_gpu_seconds >= 0),
    at_us            bigint  NOT NULL,
    reason           text    NOT NULL,
    event_id         text    NOT NULL,
    PRIMARY KEY (job_id, generation)
);
CREATE INDEX lost_work_queue ON lost_work (queue, at_us);
