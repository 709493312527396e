-- The change feed follows the log by transaction, not by id alone. An entry's id is taken when its
-- transaction inserts it, but the entry is visible only once that transaction commits, which can
-- be long after later ids (an operator's revocation inside a longer transaction, a thousand keys
-- changed in one). Each entry records its transaction; a gateway re-reads every entry of a
-- transaction that was still running at its previous read (pg_snapshot_xmin), so none is missed.
ALTER TABLE gateway.api_key_changes ADD COLUMN xid xid8 NOT NULL DEFAULT pg_current_xact_id();
CREATE INDEX api_key_changes_xid ON gateway.api_key_changes (xid);

-- A key row deleted by hand is a change too: every gateway drops the key from its cache.
CREATE OR REPLACE FUNCTION gateway.record_api_key_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'DELETE' THEN
    INSERT INTO gateway.api_key_changes (key_id, key_hash) VALUES (OLD.id, OLD.key_hash);
    PERFORM pg_notify('gateway_api_key_changes', OLD.id);
    RETURN OLD;
  END IF;
  INSERT INTO gateway.api_key_changes (key_id, key_hash) VALUES (NEW.id, NEW.key_hash);
  PERFORM pg_notify('gateway_api_key_changes', NEW.id);
  RETURN NEW;
END
$$;

CREATE TRIGGER api_key_deleted
  AFTER DELETE ON gateway.api_keys
  FOR EACH ROW EXECUTE FUNCTION gateway.record_api_key_change();
