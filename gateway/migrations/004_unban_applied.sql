-- An unban is applied to the rate-limit store by a running gateway. Until one has done so (none
-- was running, or their Redis was unreachable) it stays pending here, and every gateway retries
-- the pending ones: at start and every few seconds. `keys unban` reports whether it was applied.
ALTER TABLE gateway.api_key_changes ADD COLUMN applied_at timestamptz;
-- Unbans logged before this column existed were applied by the gateways of the time: none of
-- them is pending (retrying one now could lift a ban set since).
UPDATE gateway.api_key_changes SET applied_at = changed_at WHERE kind = 'unban';
CREATE INDEX api_key_changes_pending_unbans ON gateway.api_key_changes (id)
  WHERE kind = 'unban' AND applied_at IS NULL;
