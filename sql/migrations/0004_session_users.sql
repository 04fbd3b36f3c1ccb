-- 0004_session_users: the user a session belongs to (bound at its first write, never changed).

ALTER TABLE sessions ADD COLUMN user_id VARCHAR;
