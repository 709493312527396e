-- Row triggers do not fire on TRUNCATE: a keys table emptied by hand was announced to no gateway,
-- and each went on accepting the keys it had cached until the TTL. Each key is announced as the
-- statement begins, while its row can still be read, as a row deleted by hand is.
CREATE FUNCTION gateway.record_api_keys_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO gateway.api_key_changes (key_id, key_hash) SELECT id, key_hash FROM gateway.api_keys;
  PERFORM pg_notify('gateway_api_key_changes', '');
  RETURN NULL;
END
$$;

CREATE TRIGGER api_keys_truncated
  BEFORE TRUNCATE ON gateway.api_keys
  FOR EACH STATEMENT EXECUTE FUNCTION gateway.record_api_keys_truncated();
