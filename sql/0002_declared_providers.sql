-- Declared providers: REST APIs described in a YAML file (see docs/declarative-connectors.md),
-- stored here so that every worker runs them without a deploy. Runs with search_path set to
-- the target schema.

-- Every version of every declared provider, as the file was given (its lines are the ones its
-- mistakes were reported at). A version is never changed: a new file is a new version.
CREATE TABLE declared_provider_versions (
    name        text NOT NULL CHECK (name ~ '^[a-z][a-z0-9_]{0,62}$'),
    version     integer NOT NULL CHECK (version >= 1),
    source      text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, version)
);

-- The declared providers, one row each, naming the version new runs take. Invariants: a name
-- here has the version it names, by commit time (the key is checked then, as an add writes the
-- row before the version it will name); adds of one name serialize on its row; and a
-- connection is created for a declared provider only while its row is here: the creation
-- share-locks the row, which the removal locks for update before it counts the connections
-- (see sql/providers.sql).
CREATE TABLE declared_providers (
    name        text PRIMARY KEY,
    version     integer NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (name, version) REFERENCES declared_provider_versions (name, version)
        DEFERRABLE INITIALLY DEFERRED
);

-- The version each run of a declared provider started on, so its later attempts run the same
-- file though a new version was added meanwhile. Invariant: one version per run, written once,
-- by the run's first attempt (fenced); it goes with the run, or with the provider's removal.
CREATE TABLE declared_provider_runs (
    run_id   bigint PRIMARY KEY REFERENCES connection_runs (id) ON DELETE CASCADE,
    name     text NOT NULL,
    version  integer NOT NULL,
    FOREIGN KEY (name, version) REFERENCES declared_provider_versions (name, version)
        ON DELETE CASCADE
);
