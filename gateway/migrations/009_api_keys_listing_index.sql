-- `keys list` reads the keys page by page in creation order (a statement each, under the pool's
-- timeout, however many keys there are): this index walks that order from where a page ended.
CREATE INDEX api_keys_created_at_id ON gateway.api_keys (created_at, id);
