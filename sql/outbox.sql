-- The recommended outbox table for outbox-cdc, its publication, and an example business transaction.
-- Apply with: psql "$OUTBOX_CDC_POSTGRES" -f sql/outbox.sql   (idempotent)

CREATE TABLE IF NOT EXISTS public.outbox (
    event_id          uuid        PRIMARY KEY,             -- Kafka header event_id: consumers deduplicate on it
    event_type        text        NOT NULL,                -- chooses the topic (routing.topic, routing.topics)
    aggregate_type    text,                                -- header aggregate_type; usable in the topic template
    aggregate_id      text        NOT NULL,                -- the Kafka key: per-aggregate order
    aggregate_version bigint,                              -- header aggregate_version
    payload           jsonb       NOT NULL,                -- the record value, forwarded as stored (json, text and bytea work too)
    headers           jsonb,                               -- every key becomes a Kafka header (traceparent, ...)
    created_at        timestamptz NOT NULL DEFAULT now()   -- header created_at (RFC 3339, UTC)
);

-- Inserts only: outbox-cdc ignores updates and deletes, so applications may delete what they insert.
-- Via the partition root: a partitioned outbox's rows then arrive under its own name.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_publication WHERE pubname = 'outbox_cdc') THEN
        CREATE PUBLICATION outbox_cdc FOR TABLE public.outbox WITH (publish = 'insert', publish_via_partition_root = true);
    END IF;
END $$;

-- Example: a business change and its event in one transaction. The event row is deleted in the same
-- transaction, so the table never grows; the WAL still carries the insert and outbox-cdc delivers it.
--
-- BEGIN;
--   UPDATE orders SET status = 'paid' WHERE id = 42;
--   WITH e AS (
--     INSERT INTO outbox (event_id, event_type, aggregate_type, aggregate_id, aggregate_version, payload, headers)
--     VALUES (gen_random_uuid(), 'OrderPaid', 'order', '42', 7,
--             '{"order_id": 42, "amount": "19.99"}',
--             '{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}')
--     RETURNING event_id)
--   DELETE FROM outbox WHERE event_id IN (SELECT event_id FROM e);
-- COMMIT;
