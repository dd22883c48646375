-- usage_rejected gains what a bounded Rejected record carries (DESIGN §6,
-- invariant 10): raw_key and raw_value hold at most the first 16 KiB of the
-- source record's key and value; these columns give the whole lengths and
-- the SHA-256 of the whole bytes (lowercase hex). A row written before this
-- migration reads -1 and '' (the record carried the raw bytes whole).
-- 18.16 has no IF NOT EXISTS on ALTER ... COLUMN: one statement, which
-- adds all four columns or none.
ALTER TABLE usage_rejected
    ADD COLUMN raw_key_length Int64 DEFAULT -1,
    ADD COLUMN raw_key_sha256 String DEFAULT '',
    ADD COLUMN raw_value_length Int64 DEFAULT -1,
    ADD COLUMN raw_value_sha256 String DEFAULT '';
