-- Bans live in the rate-limit store (Redis, or the embedded store's memory), where the gateways
-- decide them. Each ban is also written here by the gateway that started it, so an operator can
-- see with `keys show` and `keys list` which keys are banned and until when; `keys unban`
-- deletes the row with the request to lift it. A row is a record, not the ban itself: a Redis
-- that lost its data has forgotten a ban this table still lists until its end.
CREATE TABLE gateway.api_key_bans (
  key_id      text        PRIMARY KEY REFERENCES gateway.api_keys (id) ON DELETE CASCADE,
  -- The ladder step (0 = the first), as the `step` label of gateway_bans_total.
  step        smallint    NOT NULL CHECK (step >= 0),
  started_at  timestamptz NOT NULL,
  ends_at     timestamptz NOT NULL CHECK (ends_at > started_at)
);
