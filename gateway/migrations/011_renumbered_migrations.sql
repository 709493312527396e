-- Numbers 009 and 010 named other files for a while before they were renumbered: 009 an index on
-- the change log's changed_at (the purge has since walked the log by id instead), 010 the keys
-- listing index. The migrator goes by number, so a database migrated then took the current 009
-- (when only the old one had run: `keys list` pages without their index) or 010 (the id bound
-- below) as applied and never ran it, and kept the changed_at index, written on every change and
-- read by nothing. This gives such a database the schema of any other, and its records the names
-- of the files. On any other database it changes nothing and takes no table lock: each step looks
-- first (a rolling deploy would otherwise wait behind, and hold up, any open use of the key tables).
DO $$
BEGIN
  IF to_regclass('gateway.api_keys_created_at_id') IS NULL THEN
    CREATE INDEX api_keys_created_at_id ON gateway.api_keys (created_at, id);
  END IF;
  IF (SELECT seqmax FROM pg_sequence
       WHERE seqrelid = pg_get_serial_sequence('gateway.api_key_changes', 'id')::regclass) <> 9007199254740991 THEN
    ALTER TABLE gateway.api_key_changes ALTER COLUMN id SET MAXVALUE 9007199254740991;
  END IF;
  IF to_regclass('gateway.api_key_changes_changed_at') IS NOT NULL THEN
    DROP INDEX gateway.api_key_changes_changed_at;
  END IF;
END
$$;
UPDATE gateway.schema_migrations SET name = '009_api_keys_listing_index.sql' WHERE version = 9 AND name <> '009_api_keys_listing_index.sql';
UPDATE gateway.schema_migrations SET name = '010_change_log_id_max.sql' WHERE version = 10 AND name <> '010_change_log_id_max.sql';
