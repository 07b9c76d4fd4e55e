-- The W3C traceparent of the step that wrote each row, so the effects carried out later (also by a restarted
-- coordinator) are children of that step in the decision's trace: a protocol keeps its newest command's,
-- an outbox row the one of the transition that queued it ('' when none travelled).
ALTER TABLE protocols ADD COLUMN traceparent text NOT NULL DEFAULT '';
ALTER TABLE outbox ADD COLUMN traceparent text NOT NULL DEFAULT '';
