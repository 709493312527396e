-- Change-log ids reach the gateway as JavaScript numbers, exact up to 2^53 - 1: beyond, two ids
-- would read as one and the feed would take the second for the first, never delivering it.
-- The identity stops there (as pets.pets' does) rather than wrap into that.
ALTER TABLE gateway.api_key_changes ALTER COLUMN id SET MAXVALUE 9007199254740991;
