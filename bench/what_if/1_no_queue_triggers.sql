-- What-if 1: the approval queue's PL/pgSQL triggers dropped.
-- open_approvals goes stale: for measuring the workflow benchmark's throughput only.
DROP TRIGGER tool_calls_queue_insert ON tool_calls;
DROP TRIGGER tool_calls_queue_update ON tool_calls;
DROP TRIGGER turns_queue_update ON turns;
DROP TRIGGER turns_queue_insert ON turns;
