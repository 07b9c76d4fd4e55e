-- The step each job's newest checkpoint says the job ends at (0: unknown): with `step`, how far the job has got.
ALTER TABLE checkpoints ADD COLUMN total_steps bigint NOT NULL DEFAULT 0;
