-- API keys. Only a SHA-256 hash of each key is stored; the plaintext is shown once at creation.
CREATE TABLE gateway.api_keys (
  id              text        PRIMARY KEY,
  key_hash        bytea       NOT NULL UNIQUE CHECK (octet_length(key_hash) = 32),
  -- The first characters of the key, so an operator can tell keys apart without the secret.
  display_prefix  text        NOT NULL,
  name            text        NOT NULL CHECK (char_length(name) BETWEEN 1 AND 200),
  plan            text        NOT NULL,
  -- Custom limits (the Enterprise plan's "custom"); NULL means the plan's own.
  per_minute      integer     CHECK (per_minute > 0),
  per_day         integer     CHECK (per_day > 0),
  created_at      timestamptz NOT NULL DEFAULT now(),
  expires_at      timestamptz,
  revoked_at      timestamptz,
  updated_at      timestamptz NOT NULL DEFAULT now()
);

-- Every change to a key is appended here and announced with NOTIFY. Gateways invalidate their
-- key caches from this log: the notification makes it immediate, a one-second catch-up read of
-- the log covers missed notifications and Postgres front-ends without LISTEN (PGlite, PgBouncer).
CREATE TABLE gateway.api_key_changes (
  id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  key_id      text        NOT NULL,
  key_hash    bytea       NOT NULL,
  changed_at  timestamptz NOT NULL DEFAULT now()
);

CREATE FUNCTION gateway.record_api_key_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO gateway.api_key_changes (key_id, key_hash) VALUES (NEW.id, NEW.key_hash);
  PERFORM pg_notify('gateway_api_key_changes', NEW.id);
  RETURN NEW;
END
$$;

CREATE TRIGGER api_key_changed
  AFTER INSERT OR UPDATE ON gateway.api_keys
  FOR EACH ROW EXECUTE FUNCTION gateway.record_api_key_change();
