-- Consumer-group lifecycle: catching up after resurrection, forgetting a
-- group that left until nothing refers to it, and isolating messages whose
-- lease expired.

-- A pending backfill: before anyone fetches for the group again, the
-- group is raised on the stored rows of its stream that are not visible in
-- backfill_from and that it has not completed (at most backfill_left of
-- them), whether other groups finished them or none needed them. Until it
-- is done, cleanup leaves those rows alone.
ALTER TABLE outbox_subscription_offsets
    ADD COLUMN backfill_from pg_snapshot,
    ADD COLUMN backfill_left bigint NOT NULL DEFAULT 0;

-- A DEAD or CANCELLED group stays in the required sets of rows written by
-- producers that read the subscribed set before it left; forgetting is
-- re-run until a pass finds nothing (then forget_pending is false).
ALTER TABLE outbox_topic_subscriptions
    ADD COLUMN forget_pending boolean NOT NULL DEFAULT false;
UPDATE outbox_topic_subscriptions SET forget_pending = true
WHERE subscription_status IN ('DEAD', 'CANCELLED');

-- How often a message's lease ran out (its instance crashed or hung while
-- holding it). Such messages are retried one at a time per group, so a
-- message that crashes its process does not take others down with it.
ALTER TABLE outbox_group_retries
    ADD COLUMN lease_expiries integer NOT NULL DEFAULT 0;
