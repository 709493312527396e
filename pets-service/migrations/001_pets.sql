-- The catalogue. Ids are capped at 2^53 - 1 so every id survives a JSON round trip exactly.
CREATE TABLE pets.pets (
  id          bigint GENERATED ALWAYS AS IDENTITY (MAXVALUE 9007199254740991) PRIMARY KEY,
  name        text        NOT NULL CHECK (char_length(name) BETWEEN 1 AND 100),
  category_id bigint      NOT NULL CHECK (category_id BETWEEN 1 AND 9007199254740991),
  status      text        NOT NULL DEFAULT 'available' CHECK (status IN ('available', 'pending', 'sold')),
  created_at  timestamptz NOT NULL DEFAULT now()
);

-- Serves the status-filtered page walk (WHERE status = $1 AND id > $2 ORDER BY id).
CREATE INDEX pets_status_id ON pets.pets (status, id);
