-- Every bound attempt as job.lifecycle announced it: a RECLAIM decision from quota names only the job, so the
-- coordinator takes its GPUs, pods and bind time (lost work counts from there) from here.
CREATE TABLE attempts (
    job_id      text             NOT NULL,
    generation  bigint           NOT NULL,
    gpus        double precision NOT NULL,
    bound_unix_s double precision NOT NULL,
    assignments bytea            NOT NULL,
    PRIMARY KEY (job_id, generation)
);
