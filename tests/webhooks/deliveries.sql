-- The statements of the webhook-delivery kind. Every write after the claim is fenced by the
-- claim's lease owner: a stale attempt's write matches nothing.

-- name: create_table
-- The kind's own table: a delivery to make, its attempts and its lease.
CREATE TABLE IF NOT EXISTS webhook_deliveries (
    id               bigserial PRIMARY KEY,
    url              text NOT NULL,
    body             jsonb NOT NULL,
    status           text NOT NULL DEFAULT 'queued'
                     CHECK (status IN ('queued', 'running', 'delivered', 'failed', 'cancelled')),
    attempts         integer NOT NULL DEFAULT 0,
    max_attempts     integer NOT NULL DEFAULT 3,
    due_at           timestamptz NOT NULL DEFAULT now(),
    lease_owner      uuid,
    lease_expires_at timestamptz,
    cancel_requested boolean NOT NULL DEFAULT false,
    error            text
);

-- name: enqueue
-- A delivery to make now.
INSERT INTO webhook_deliveries (url, body) VALUES (%(url)s, %(body)s) RETURNING id;

-- name: claim
-- Up to `limit` due deliveries (queued and due, or running under an expired lease), each under
-- a fresh lease owner: two claimers never take one delivery (SKIP LOCKED).
UPDATE webhook_deliveries d
   SET status = 'running', attempts = d.attempts + 1, lease_owner = gen_random_uuid(),
       lease_expires_at = now() + %(lease)s
 WHERE d.id IN (SELECT id FROM webhook_deliveries
                 WHERE (status = 'queued' AND due_at <= now())
                    OR (status = 'running' AND lease_expires_at < now())
                 ORDER BY due_at, id
                 LIMIT %(limit)s
                   FOR UPDATE SKIP LOCKED)
RETURNING *;

-- name: renew
-- Extends a lease this claim still holds; no row: the lease is lost.
UPDATE webhook_deliveries SET lease_expires_at = now() + %(lease)s
 WHERE id = %(id)s AND lease_owner = %(owner)s AND status = 'running'
RETURNING id;

-- name: control
-- Whether the holder must stop: no row (the lease is lost) or a cancel request.
SELECT cancel_requested FROM webhook_deliveries
 WHERE id = %(id)s AND lease_owner = %(owner)s AND status = 'running';

-- name: finish
-- The end of a delivery (delivered, failed, cancelled), fenced by its lease owner.
UPDATE webhook_deliveries
   SET status = %(status)s, error = %(error)s, lease_owner = NULL, lease_expires_at = NULL
 WHERE id = %(id)s AND lease_owner = %(owner)s AND status = 'running'
RETURNING id;

-- name: requeue
-- Back to the queue, due after `delay` seconds; `spend` false gives the attempt back. Fenced.
UPDATE webhook_deliveries
   SET status = 'queued', error = %(error)s, lease_owner = NULL, lease_expires_at = NULL,
       due_at = now() + make_interval(secs => %(delay)s),
       attempts = attempts - CASE WHEN %(spend)s THEN 0 ELSE 1 END
 WHERE id = %(id)s AND lease_owner = %(owner)s AND status = 'running'
RETURNING id;
