-- What pods carry for the forecaster (kumiki.v1.BindRequest image, command, time_limit_s): kept with each job so a
-- restarted forecast service warms up keyed as it forecast (an empty image/command and a NULL limit: none known).
ALTER TABLE job_history ADD COLUMN image text NOT NULL DEFAULT '';
ALTER TABLE job_history ADD COLUMN command text NOT NULL DEFAULT '';
ALTER TABLE job_history ADD COLUMN time_limit_s double precision;
