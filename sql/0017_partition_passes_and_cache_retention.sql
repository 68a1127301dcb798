-- The periodic complete pass per partition, totals that say they are estimates, and retention of
-- the ETag cache. See "Resuming a run" in docs/architecture.md and "Retention" in
-- docs/operations.md.


-- When each partition of a table was last read completely (and tombstoned), as an object from
-- partition to time: a partition that keeps failing no longer holds back the complete pass of
-- the others, and is itself read completely once it recovers. last_full_sync_at still says
-- when every partition was; a partition without an entry goes by it.
ALTER TABLE table_state ADD COLUMN complete_passes jsonb;


-- The provider's total of a slice was an estimate (GitHub's last page number times the page
-- size is an upper bound): shown as one, and replaced by the records read once the slice is
-- read to its end.
ALTER TABLE run_checkpoints ADD COLUMN total_estimated boolean NOT NULL DEFAULT false;


-- When a cached response was last asked for (stored, or looked up for a conditional request).
-- Entries nobody asked for in `http_cache_days` are deleted by the cleaner: a URL that is never
-- asked again (a listing whose query changes with every sync) would otherwise stay for ever.
-- The default is evaluated once, here, so adding the column rewrites nothing.
ALTER TABLE http_cache ADD COLUMN used_at timestamptz NOT NULL DEFAULT now();

-- The cleaner reads the entries unused the longest first, through this index, so a batch costs
-- its own rows however large the cache is. Like any CREATE INDEX in a migration it holds writes
-- to http_cache while it builds.
CREATE INDEX http_cache_unused ON http_cache (used_at);
