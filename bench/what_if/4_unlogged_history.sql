-- What-if 4 (run after 1, 2 and 3): the event log and the conversation written without
-- WAL. Not a design anyone should ship (a crash empties them): an upper bound on what
-- writing them costs.
ALTER TABLE turn_events SET UNLOGGED;
ALTER TABLE messages SET UNLOGGED;
