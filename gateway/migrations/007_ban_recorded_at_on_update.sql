-- recorded_at orders a ban among unbans (006). A gateway of the version before that writes a
-- ban's record without it; inserted, the column's default is its time, but a ban written over an
-- earlier one's record would keep that record's time, and an unban the newer ban overtook would
-- then lift it. A record rewritten without a new recorded_at takes the time of the rewrite.
CREATE FUNCTION gateway.ban_recorded_at_on_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.recorded_at IS NOT DISTINCT FROM OLD.recorded_at THEN
    NEW.recorded_at := now();
  END IF;
  RETURN NEW;
END
$$;
CREATE TRIGGER api_key_bans_recorded_at BEFORE UPDATE ON gateway.api_key_bans
  FOR EACH ROW EXECUTE FUNCTION gateway.ban_recorded_at_on_update();
