-- The inbox of a consuming service (package inbox): which events a consumer has handled, and the last
-- version it applied per aggregate and topic. Create it in the consumer's own database, next to the
-- tables its handlers change (inbox.Setup runs this file). Idempotent.

-- One row per handled event: the claim. A redelivered event finds its claim and is skipped.
CREATE TABLE IF NOT EXISTS public.inbox (
    consumer    text        NOT NULL,                -- the consuming service's name (not per instance)
    event_id    text        NOT NULL,                -- header event_id (or ce_id)
    outcome     text        NOT NULL,                -- applied, stale or dead_lettered
    topic       text        NOT NULL,                -- where it was read (informational)
    partition   integer     NOT NULL,
    "offset"    bigint      NOT NULL,
    handled_at  timestamptz NOT NULL DEFAULT now(),  -- retention: inbox prunes claims older than its Retention
    PRIMARY KEY (consumer, event_id)
);
CREATE INDEX IF NOT EXISTS inbox_handled_at ON public.inbox (consumer, handled_at);

-- The last applied aggregate_version per aggregate and topic: an older version is stale (a replay of an
-- event whose claim was already pruned, or an out-of-order producer). Kept per topic, since an
-- aggregate's events of different types may travel on different topics, each in order.
CREATE TABLE IF NOT EXISTS public.inbox_versions (
    consumer        text   NOT NULL,
    topic           text   NOT NULL,
    aggregate_type  text   NOT NULL,                 -- '' when the record has none
    aggregate_id    text   NOT NULL,                 -- the record key (or ce_subject)
    version         bigint NOT NULL,
    PRIMARY KEY (consumer, topic, aggregate_type, aggregate_id)
);
