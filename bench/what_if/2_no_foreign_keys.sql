-- What-if 2 (run after 1): every foreign key dropped (no after-trigger checks).
ALTER TABLE approval_queue DROP CONSTRAINT fk_approval_queue_turn_id_tool_calls;
ALTER TABLE turns DROP CONSTRAINT fk_turns_parent_id_turns;
ALTER TABLE turns DROP CONSTRAINT fk_turns_session_id_sessions;
ALTER TABLE messages DROP CONSTRAINT fk_messages_turn_id_turns;
ALTER TABLE tool_calls DROP CONSTRAINT fk_tool_calls_turn_id_turns;
ALTER TABLE turn_events DROP CONSTRAINT fk_turn_events_turn_id_turns;
