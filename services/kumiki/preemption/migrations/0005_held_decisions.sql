-- Decisions and lifecycle events are separate topics, consumed independently: a RECLAIM decision (which names
-- the job only) can be read before the BOUND event of its attempt. It is held here, durably, until that bind is
-- seen (the protocol then begins from it) or its hold deadline passes (dropped, logged).
CREATE TABLE held_decisions (
    job_id          text             NOT NULL,
    generation      bigint           NOT NULL,
    decision        bytea            NOT NULL,
    held_unix_s     double precision NOT NULL,
    deadline_unix_s double precision NOT NULL,
    PRIMARY KEY (job_id, generation)
);
CREATE INDEX held_decisions_deadline ON held_decisions (deadline_unix_s);
-- An attempt that ended is kept a while (ended_unix_s set) instead of deleted, so a decision read after the end
-- is told apart from one read before the bind.
ALTER TABLE attempts ADD COLUMN ended_unix_s double precision;
