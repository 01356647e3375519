-- A least-privilege role for outbox-cdc: it may log in, stream logical replication, and read the
-- outbox table (for `outbox-cdc resync`'s snapshot and `status`' oldest-row check). Nothing else.
-- Run with psql as a superuser (or a role with CREATEROLE that owns the table); choose the password:
--
--   psql "$ADMIN_URL" -v password="'change-me'" -f sql/role.sql

CREATE ROLE outbox_cdc LOGIN REPLICATION PASSWORD :password;
GRANT CONNECT ON DATABASE :"DBNAME" TO outbox_cdc;
GRANT USAGE ON SCHEMA public TO outbox_cdc;
GRANT SELECT ON public.outbox TO outbox_cdc;

-- The router's role then cannot create the publication (that needs ownership of the table): create
-- it once as an administrator, with `outbox-cdc init` run as one or by hand, and run the router with
-- postgres.create_publication: false. The slot needs only REPLICATION, which the role has.
--   CREATE PUBLICATION outbox_cdc FOR TABLE public.outbox WITH (publish = 'insert', publish_via_partition_root = true);
