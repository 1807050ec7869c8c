-- pgembed 0013: functions, trigger functions, triggers on pgembed's tables and their grants now
-- have one definition each, in pgembed/sql/definitions/, which `pgembed migrate` re-applies after
-- the migrations whenever a file changed; migrations keep only what runs once (tables, columns,
-- data moves, drops). This table records what was applied.

CREATE TABLE pgembed.definitions (
    file       text PRIMARY KEY,
    sha256     text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
