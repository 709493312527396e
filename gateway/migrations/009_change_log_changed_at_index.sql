-- The hourly purge deletes a day-old change log oldest first, in batches (one operator
-- transaction can leave millions of entries): through this index, the rows already deleted are
-- not stepped over again on every batch.
CREATE INDEX api_key_changes_changed_at ON gateway.api_key_changes (changed_at);
