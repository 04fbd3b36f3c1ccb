-- 0003_message_ids: the client's id of a message, so that a retried message is stored once.

ALTER TABLE turns ADD COLUMN message_id VARCHAR;
