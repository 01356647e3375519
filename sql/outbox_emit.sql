-- outbox_emit writes an outbox event as a transactional WAL message (pg_logical_emit_message) that
-- outbox-cdc reads with postgres.message_prefixes: nothing is written to a table, so there is no heap
-- tuple, index entry or dead tuple for vacuum. Call it in the transaction of the business change; it
-- returns the event's id. `outbox-cdc init` installs it (in the outbox table's schema, with the first
-- of postgres.message_prefixes) when the source reads messages; any role may call it.
--
--   BEGIN;
--   UPDATE orders SET status = 'paid' WHERE id = 42;
--   SELECT outbox_emit('OrderPaid', 'order', '42', '{"total": 9.99}');
--   COMMIT;
CREATE OR REPLACE FUNCTION public.outbox_emit(
    event_type text,
    aggregate_type text,
    aggregate_id text,
    payload jsonb,
    headers jsonb DEFAULT NULL)
RETURNS uuid
LANGUAGE plpgsql VOLATILE
AS $fn$
DECLARE
    id uuid := gen_random_uuid();
BEGIN
    PERFORM pg_logical_emit_message(true, 'outbox', jsonb_build_object(
        'event_id', id, 'event_type', event_type, 'aggregate_type', aggregate_type,
        'aggregate_id', aggregate_id, 'payload', payload, 'headers', headers)::text);
    RETURN id;
END
$fn$;
