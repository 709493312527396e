-- A ban's record written late (a retry, or one that waited behind another ban's write, as in a burst
-- of bans) first looks for an applied unban of its key (recordBan). Without an index on key_id
-- that read the whole change log: 245 ms and 300 MB at 3 M entries (a day after a bulk change of
-- a million keys), once per ban, each holding a connection of the pool the key lookups need.
-- Unbans are a small part of the log, and the only entries looked up by key. Not CONCURRENTLY:
-- each migration runs in a transaction. The build blocks writes to the log (key changes, unbans)
-- for its length, half a second at 3 M entries; the feed's reads go on.
CREATE INDEX api_key_changes_unbans_by_key ON gateway.api_key_changes (key_id, changed_at) WHERE kind = 'unban';
