-- A pet deleted (by hand: the API has none) cascades to its idempotency keys through this column;
-- without an index each deletion scanned the whole table (240 ms at 1.5 M keys).
CREATE INDEX idempotency_keys_pet_id ON pets.idempotency_keys (pet_id);
