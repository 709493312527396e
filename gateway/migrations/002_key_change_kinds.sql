-- The change log also carries operator actions that are not row updates: `unban` lifts a
-- key's ban on every gateway (each applies it to its rate-limit store and local ban cache).
ALTER TABLE gateway.api_key_changes ADD COLUMN kind text NOT NULL DEFAULT 'updated'
  CHECK (kind IN ('updated', 'unban'));
