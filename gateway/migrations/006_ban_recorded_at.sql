-- A ban's started_at is the rate-limit store's time (Redis TIME), an unban's changed_at is
-- Postgres's now(). Comparing the two told which came first only while both clocks agreed: with
-- Redis a minute ahead, a fresh unban that Redis could not take at once looked overtaken by the
-- ban it was meant to lift and was closed as applied, the ban staying. recorded_at is Postgres's
-- time too, so the order of a ban and an unban is decided on one clock.
ALTER TABLE gateway.api_key_bans ADD COLUMN recorded_at timestamptz;
UPDATE gateway.api_key_bans SET recorded_at = started_at;
ALTER TABLE gateway.api_key_bans ALTER COLUMN recorded_at SET NOT NULL, ALTER COLUMN recorded_at SET DEFAULT now();
