-- What-if 1: the approval queue's PL/pgSQL triggers dropped.
-- open_approvals goes stale: for measuring the workflow benchmark's throughput only.
DROP TRIGGER tool_calls_queue_insert ON tool_calls;
DROP TRIGGER tool_calls_queue_update ON tool_calls;
DROP TRIGGER turns_queue_update ON turns;
DROP TRIGGER turns_queue_insert ON turns;

-- What-if 2 (adds to 1): every foreign key dropped (no after-trigger checks).
ALTER TABLE approval_queue DROP CONSTRAINT fk_approval_queue_turn_id_tool_calls;
ALTER TABLE turns DROP CONSTRAINT fk_turns_parent_id_turns;
ALTER TABLE turns DROP CONSTRAINT fk_turns_session_id_sessions;
ALTER TABLE messages DROP CONSTRAINT fk_messages_turn_id_turns;
ALTER TABLE tool_calls DROP CONSTRAINT fk_tool_calls_turn_id_turns;
ALTER TABLE turn_events DROP CONSTRAINT fk_turn_events_turn_id_turns;

-- What-if 3 (adds to 2): the indexes the workflow never reads dropped (the operators'
-- views and the expiry job read them).
DROP INDEX ix_turns_parent_id;
DROP INDEX ix_turn_events_turn_id;
DROP INDEX ix_tool_calls_deadline;
DROP INDEX ix_tool_calls_open;

-- What-if 4 (adds to 3): the event log and the conversation written without WAL. Not a
-- design anyone should ship (a crash empties them): an upper bound on what writing them
-- costs.
ALTER TABLE turn_events SET UNLOGGED;
ALTER TABLE messages SET UNLOGGED;
