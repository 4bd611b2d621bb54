-- What-if 3 (run after 1 and 2): the indexes the workflow never reads dropped (the operators'
-- views and the expiry job read them). turn_events is keyed by turn since migration 0023: its
-- one index is its primary key.
DROP INDEX ix_turns_parent_id;
DROP INDEX ix_tool_calls_deadline;
DROP INDEX ix_tool_calls_open;
