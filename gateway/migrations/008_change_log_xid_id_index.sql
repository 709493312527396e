-- The change feed reads what a transaction still running at its previous read wrote, page by page
-- in id order (one operator transaction may hold millions of entries), and the entries of later
-- transactions that took an older id: both by (xid, id). It replaces the index on xid alone.
CREATE INDEX api_key_changes_xid_id ON gateway.api_key_changes (xid, id);
DROP INDEX gateway.api_key_changes_xid;
