-- A job is learned from once, at its end, with its whole run time; a preempted attempt is a stop, not an ending.
-- started_at: when the generation's pods were bound (a restarted service restarts the job's run clock there);
-- attempt_s: how long this generation ran; lost_s: the work it lost when preempted (since its last checkpoint).
ALTER TABLE job_history ADD COLUMN started_at timestamptz;
ALTER TABLE job_history ADD COLUMN attempt_s double precision;
ALTER TABLE job_history ADD COLUMN lost_s double precision NOT NULL DEFAULT 0;
-- Rows written before this learned each attempt's run time as a job's: keep it as the attempt's, unlearned...
UPDATE job_history SET attempt_s = runtime_s WHERE runtime_s IS NOT NULL;
UPDATE job_history SET runtime_s = NULL WHERE final_state = 'preempted';
-- ...and give each ending the run time of the attempts preempted before it (since the job's previous ending).
UPDATE job_history AS ended
   SET runtime_s = ended.runtime_s + (
       SELECT coalesce(sum(earlier.attempt_s), 0) FROM job_history AS earlier
        WHERE earlier.job_id = ended.job_id AND earlier.final_state = 'preempted'
          AND earlier.generation < ended.generation
          AND earlier.generation > coalesce((
              SELECT max(previous.generation) FROM job_history AS previous
               WHERE previous.job_id = ended.job_id AND previous.generation < ended.generation
                 AND previous.final_state IN ('completed', 'failed', 'released')), 0))
 WHERE ended.runtime_s IS NOT NULL AND ended.final_state IN ('completed', 'failed');
