-- Declared providers (see sql/0003_declared_providers.sql): storing them, listing them, removing
-- them, and the version a run takes. Called through sync.store.providers.ProviderStore.

-- name: claim_declared_name
-- An add's first step: the provider's row, created (naming no version yet) or locked until the
-- add commits, so two adds of one name take turns and number their versions apart.
INSERT INTO declared_providers (name, version)
VALUES (%(name)s, 0)
ON CONFLICT (name) DO UPDATE SET updated_at = now()
RETURNING name;

-- name: add_declared_version
-- Stores a file as the next version of its provider, under the row lock of claim_declared_name
-- (a statement after it, so it sees the versions every earlier add committed). Invariant:
-- versions of one name are 1, 2, 3..., never reused while the provider is declared.
INSERT INTO declared_provider_versions (name, version, source)
SELECT %(name)s, coalesce(max(version), 0) + 1, %(source)s
  FROM declared_provider_versions
 WHERE name = %(name)s
RETURNING version;

-- name: point_declared_provider
-- Points the provider at the version just stored, in the add's transaction: runs that start
-- after it commits take that version; runs already started keep theirs (pin_declared_version).
UPDATE declared_providers SET version = %(version)s, updated_at = now()
 WHERE name = %(name)s
RETURNING version;

-- name: declared_heads
-- The declared providers and the version new runs take: what a process loads.
SELECT name, version FROM declared_providers ORDER BY name;

-- name: declared_sources
-- The files of the given versions, for a process that has not read them yet.
SELECT v.name, v.version, v.source, v.created_at
  FROM declared_provider_versions v
  JOIN unnest(%(names)s::text[], %(versions)s::int[]) AS wanted (name, version)
       USING (name, version);

-- name: lock_declared_provider
-- The removal's first step: locks the provider's row until the removal commits, so a
-- connection being created for it (create_connection share-locks the row) either committed
-- before, and is counted next, or waits and then finds the provider gone.
SELECT name FROM declared_providers WHERE name = %(name)s FOR UPDATE;

-- name: connections_of_provider
-- The connections of a provider (deleting ones too: their rows are still there), counted in a
-- statement after the lock, whose snapshot sees every connection committed before it.
SELECT count(*) AS connections FROM connections WHERE provider = %(provider)s;

-- name: remove_declared_provider
-- Removes a provider and its versions (the versions pinned by finished runs go with their pins).
WITH head AS (
    DELETE FROM declared_providers WHERE name = %(name)s RETURNING name
)
DELETE FROM declared_provider_versions v USING head WHERE v.name = head.name
RETURNING v.version;

-- name: pin_declared_version
-- The version a run of a declared provider reads with, and its file: the one its first attempt
-- took, else the provider's current one, written now. Invariant: a run keeps one version for
-- all its attempts; fenced, so only the run's live attempt writes it. No row: the lease is lost,
-- or the provider was removed.
WITH fence AS (
    SELECT id FROM connection_runs
     WHERE run_fence_v1(connection_runs, %(run_id)s, %(lease_owner)s)
       FOR SHARE
), pinned AS (
    INSERT INTO declared_provider_runs (run_id, name, version)
    SELECT fence.id, d.name, d.version
      FROM fence JOIN declared_providers d ON d.name = %(provider)s
    ON CONFLICT (run_id) DO NOTHING
    RETURNING name, version
), chosen AS (
    SELECT name, version FROM pinned
    UNION ALL
    SELECT p.name, p.version FROM declared_provider_runs p, fence WHERE p.run_id = fence.id
)
SELECT c.version, v.source
  FROM chosen c JOIN declared_provider_versions v USING (name, version)
 LIMIT 1;
