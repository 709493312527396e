-- A retried POST /pets with the same Idempotency-Key returns the first pet instead of a second
-- row. Keys are scoped by consumer (the API key id the gateway forwards) so two clients can
-- never see each other's pets through a shared key value.
CREATE TABLE pets.idempotency_keys (
  consumer     text        NOT NULL,
  key          text        NOT NULL,
  fingerprint  text        NOT NULL,
  pet_id       bigint      REFERENCES pets.pets (id) ON DELETE CASCADE,
  created_at   timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (consumer, key)
);

CREATE INDEX idempotency_keys_created_at ON pets.idempotency_keys (created_at);
