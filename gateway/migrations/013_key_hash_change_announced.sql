-- A row whose key_hash is replaced (by hand: a leaked key reissued under its id) was announced with
-- its new hash only. Gateways key their caches by hash, so each went on accepting the old key from
-- its cache until the TTL. Such an update is announced under the old hash too.
CREATE OR REPLACE FUNCTION gateway.record_api_key_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'DELETE' THEN
    INSERT INTO gateway.api_key_changes (key_id, key_hash) VALUES (OLD.id, OLD.key_hash);
    PERFORM pg_notify('gateway_api_key_changes', OLD.id);
    RETURN OLD;
  END IF;
  IF TG_OP = 'UPDATE' AND OLD.key_hash IS DISTINCT FROM NEW.key_hash THEN
    INSERT INTO gateway.api_key_changes (key_id, key_hash) VALUES (OLD.id, OLD.key_hash);
  END IF;
  INSERT INTO gateway.api_key_changes (key_id, key_hash) VALUES (NEW.id, NEW.key_hash);
  PERFORM pg_notify('gateway_api_key_changes', NEW.id);
  RETURN NEW;
END
$$;
