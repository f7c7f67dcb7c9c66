"""The state database's tables, as numbered migrations applied on start (sdk.state.database).

A replica applies the ones the database has not seen, under a lock, so replicas starting together
apply each once; a database migrated by a newer tandem (a version above the last here) is refused
rather than written in a shape this code does not know. Append migrations; never edit one that
has shipped.

Each table here is declared once in sdk.state.tables (its columns, types, keys and indexes, shared with the
SQLite stores' twin where there is one), and tests/state/test_declared_tables.py checks what these migrations
make against the declarations. A new migration is written from the changed declaration (`Table.ddl(POSTGRES)`
makes a new table; ALTERs follow it), so the check still holds after it.

Leases: every replica has a row in tandem_replicas whose `expires_at` its heartbeat pushes forward.
What a replica holds (budget reservations, requests in flight) counts only while its lease runs,
and the heartbeat of any replica deletes what expired replicas still hold, so a replica that died
(SIGKILL, a lost host) holds nothing past its lease.

Spend reservations are decided in `tandem_reserve` under transaction-scoped advisory locks on each
(scope, period), taken in a fixed order; `tandem_settle` takes the same locks. So no reservation
reads a spend that a settle has updated and a reservation it has not yet deleted (or the other
way round), and the bound of sdk.budgets.manager holds across replicas.
"""

from __future__ import annotations

# The lock every replica takes to migrate: any constant, the same in every version.
MIGRATION_LOCK = 7_301_154_911

_V1 = """
CREATE TABLE tandem_replicas (
    id TEXT PRIMARY KEY,
    started_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at TIMESTAMPTZ NOT NULL
);

CREATE TABLE tandem_spend (
    scope TEXT NOT NULL,
    period TEXT NOT NULL,
    usd DOUBLE PRECISION NOT NULL,
    cloud_tokens BIGINT NOT NULL,
    total_tokens BIGINT NOT NULL,
    requests BIGINT NOT NULL,
    PRIMARY KEY (scope, period)
);

CREATE SEQUENCE tandem_reservation_ids;

CREATE TABLE tandem_reservations (
    id BIGINT NOT NULL,
    replica TEXT NOT NULL,
    scope TEXT NOT NULL,
    period TEXT NOT NULL,
    usd DOUBLE PRECISION NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (id, scope, period)
);
CREATE INDEX tandem_reservations_by_pair ON tandem_reservations (scope, period);
CREATE INDEX tandem_reservations_by_replica ON tandem_reservations (replica);

-- One token bucket per client (a key's digest, or its address); times are the replicas' wall clocks
-- (seconds since the epoch). A bucket is deleted once it would be full again (`full_at`): a fresh one
-- is the same.
CREATE TABLE tandem_rate_buckets (
    client TEXT PRIMARY KEY,
    tokens DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL,
    full_at DOUBLE PRECISION NOT NULL
);

CREATE TABLE tandem_in_flight (
    client TEXT NOT NULL,
    replica TEXT NOT NULL,
    count INTEGER NOT NULL,
    PRIMARY KEY (client, replica)
);
CREATE INDEX tandem_in_flight_by_replica ON tandem_in_flight (replica);

CREATE TABLE tandem_auth_failures (
    address TEXT PRIMARY KEY,
    count INTEGER NOT NULL,
    last_at DOUBLE PRECISION NOT NULL,
    until_at DOUBLE PRECISION NOT NULL,
    forget_at DOUBLE PRECISION NOT NULL
);

-- Take a token from a client's bucket (refilled first): 0 when taken, else the seconds until one is there.
CREATE FUNCTION tandem_take_token(
    p_client TEXT, p_burst DOUBLE PRECISION, p_per_s DOUBLE PRECISION, p_now DOUBLE PRECISION
) RETURNS DOUBLE PRECISION
LANGUAGE plpgsql AS $$
DECLARE
    b tandem_rate_buckets%ROWTYPE;
    level DOUBLE PRECISION;
BEGIN
    INSERT INTO tandem_rate_buckets VALUES (p_client, p_burst, p_now, p_now) ON CONFLICT (client) DO NOTHING;
    SELECT * INTO b FROM tandem_rate_buckets WHERE client = p_client FOR UPDATE;
    -- A clock that steps back (or a replica's that lags) must not drain a bucket.
    level := least(p_burst, b.tokens + greatest(0, p_now - b.updated_at) * p_per_s);
    IF level >= 1 THEN
        UPDATE tandem_rate_buckets SET tokens = level - 1, updated_at = greatest(b.updated_at, p_now),
            full_at = greatest(b.updated_at, p_now) + (p_burst - level + 1) / p_per_s WHERE client = p_client;
        RETURN 0;
    END IF;
    UPDATE tandem_rate_buckets SET tokens = level, updated_at = greatest(b.updated_at, p_now) WHERE client = p_client;
    RETURN (1 - level) / p_per_s;
END $$;

-- Count a request in flight for a client on a replica, unless live replicas already serve p_max of its.
CREATE FUNCTION tandem_enter(p_client TEXT, p_replica TEXT, p_max INTEGER) RETURNS BOOLEAN
LANGUAGE plpgsql AS $$
DECLARE
    n BIGINT;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('in-flight|' || p_client, 0));
    SELECT coalesce(sum(f.count), 0) INTO n FROM tandem_in_flight f JOIN tandem_replicas p ON p.id = f.replica
        WHERE f.client = p_client AND p.expires_at > now();
    IF n >= p_max THEN
        RETURN FALSE;
    END IF;
    INSERT INTO tandem_in_flight AS f VALUES (p_client, p_replica, 1)
        ON CONFLICT (client, replica) DO UPDATE SET count = f.count + 1;
    RETURN TRUE;
END $$;

-- A failed key from an address: the wait it now starts (0 before p_after failures; then 1 s doubling to p_max_wait).
CREATE FUNCTION tandem_auth_failed(
    p_address TEXT, p_now DOUBLE PRECISION, p_after INTEGER, p_max_wait DOUBLE PRECISION, p_forget DOUBLE PRECISION
) RETURNS DOUBLE PRECISION
LANGUAGE plpgsql AS $$
DECLARE
    n INTEGER;
    wait DOUBLE PRECISION;
BEGIN
    INSERT INTO tandem_auth_failures VALUES (p_address, 0, p_now, p_now, p_now + p_forget)
        ON CONFLICT (address) DO NOTHING;
    SELECT CASE WHEN p_now - last_at >= p_forget THEN 1 ELSE count + 1 END INTO n
        FROM tandem_auth_failures WHERE address = p_address FOR UPDATE;
    wait := CASE WHEN n < p_after THEN 0 ELSE least(p_max_wait, 2.0 ^ (n - p_after)) END;
    UPDATE tandem_auth_failures SET count = n, last_at = p_now, until_at = p_now + wait, forget_at = p_now + p_forget
        WHERE address = p_address;
    RETURN wait;
END $$;

-- Hold p_usd against each (scope, period) with its limit, or say which one it would break:
-- (reservation id, 0, 0, 0), or (NULL, its 1-based index, spent, held by live replicas).
CREATE FUNCTION tandem_reserve(
    p_replica TEXT, p_scopes TEXT[], p_periods TEXT[], p_limits DOUBLE PRECISION[], p_usd DOUBLE PRECISION
) RETURNS TABLE (reservation BIGINT, failed INTEGER, spent DOUBLE PRECISION, held DOUBLE PRECISION)
LANGUAGE plpgsql AS $$
DECLARE
    i INTEGER;
    s DOUBLE PRECISION;
    h DOUBLE PRECISION;
    rid BIGINT;
BEGIN
    PERFORM tandem_lock_pairs(p_scopes, p_periods);
    FOR i IN 1 .. coalesce(array_length(p_scopes, 1), 0) LOOP
        SELECT coalesce(sum(sp.usd), 0) INTO s FROM tandem_spend sp
            WHERE sp.scope = p_scopes[i] AND sp.period = p_periods[i];
        SELECT coalesce(sum(r.usd), 0) INTO h FROM tandem_reservations r JOIN tandem_replicas p ON p.id = r.replica
            WHERE r.scope = p_scopes[i] AND r.period = p_periods[i] AND p.expires_at > now();
        IF s + h + p_usd > p_limits[i] THEN
            RETURN QUERY SELECT NULL::BIGINT, i, s, h;
            RETURN;
        END IF;
    END LOOP;
    rid := nextval('tandem_reservation_ids');
    INSERT INTO tandem_reservations (id, replica, scope, period, usd)
        SELECT rid, p_replica, p_scopes[j], p_periods[j], p_usd FROM generate_subscripts(p_scopes, 1) AS j;
    RETURN QUERY SELECT rid, 0, 0::DOUBLE PRECISION, 0::DOUBLE PRECISION;
END $$;

-- Release a reservation (NULL: none) and add one request's cost to each (scope, period) given.
CREATE FUNCTION tandem_settle(
    p_reservation BIGINT, p_held_scopes TEXT[], p_held_periods TEXT[], p_scopes TEXT[], p_periods TEXT[],
    p_usd DOUBLE PRECISION, p_cloud_tokens BIGINT, p_total_tokens BIGINT
) RETURNS VOID
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM tandem_lock_pairs(p_held_scopes || p_scopes, p_held_periods || p_periods);
    IF p_reservation IS NOT NULL THEN
        DELETE FROM tandem_reservations WHERE id = p_reservation;
    END IF;
    INSERT INTO tandem_spend AS sp (scope, period, usd, cloud_tokens, total_tokens, requests)
        SELECT p_scopes[j], p_periods[j], p_usd, p_cloud_tokens, p_total_tokens, 1
        FROM generate_subscripts(p_scopes, 1) AS j
        ON CONFLICT (scope, period) DO UPDATE SET
            usd = sp.usd + excluded.usd,
            cloud_tokens = sp.cloud_tokens + excluded.cloud_tokens,
            total_tokens = sp.total_tokens + excluded.total_tokens,
            requests = sp.requests + 1;
END $$;

-- Transaction-scoped locks on (scope, period) pairs, in one order for every caller (no deadlock).
CREATE FUNCTION tandem_lock_pairs(p_scopes TEXT[], p_periods TEXT[]) RETURNS VOID
LANGUAGE sql AS $$
    SELECT count(pg_advisory_xact_lock(k)) FROM (
        SELECT DISTINCT hashtextextended(p_scopes[j] || '|' || p_periods[j], 0) AS k
        FROM generate_subscripts(p_scopes, 1) AS j ORDER BY 1
    ) AS keys;
$$;
"""

# The traffic record of `tandem serve` (sdk.traffic.postgres_store): the tables and columns of the SQLite
# record (sdk.traffic.schema), in a schema of their own so the queries that read a record (sdk.traffic.rows,
# sdk.traffic.table) run unchanged on either. `routers` holds the routers a background retrain swapped in, as
# ONNX bytes: the other replicas load the newest from there (sdk.traffic.shared_routers).
_V2 = """
CREATE SCHEMA tandem_traffic;

CREATE TABLE tandem_traffic.requests (
    id TEXT PRIMARY KEY,
    created_at DOUBLE PRECISION NOT NULL,
    key_fingerprint TEXT,
    model TEXT NOT NULL,
    tier TEXT NOT NULL,
    escalated INTEGER NOT NULL,
    reason TEXT NOT NULL,
    decided_by TEXT,
    degraded_reason TEXT,
    confidence DOUBLE PRECISION,
    decided_at_token INTEGER,
    finish_reason TEXT,
    router_score DOUBLE PRECISION,
    router TEXT,
    latency_ms DOUBLE PRECISION,
    local_prompt_tokens INTEGER,
    local_completion_tokens INTEGER,
    cloud_prompt_tokens INTEGER,
    cloud_completion_tokens INTEGER,
    cost_usd DOUBLE PRECISION,
    signals TEXT,
    shape BYTEA,
    shape_version INTEGER,
    embedding BYTEA,
    embedder TEXT,
    prompt_text TEXT,
    answer_text TEXT
);
CREATE INDEX requests_by_time ON tandem_traffic.requests (created_at);
CREATE INDEX requests_by_key ON tandem_traffic.requests (key_fingerprint);

CREATE TABLE tandem_traffic.labels (
    response_id TEXT NOT NULL REFERENCES tandem_traffic.requests (id) ON DELETE CASCADE,
    source TEXT NOT NULL,
    weak DOUBLE PRECISION,
    strong DOUBLE PRECISION,
    created_at DOUBLE PRECISION NOT NULL,
    detail TEXT,
    PRIMARY KEY (response_id, source)
);

CREATE TABLE tandem_traffic.counters (
    day TEXT NOT NULL,
    name TEXT NOT NULL,
    value BIGINT NOT NULL,
    PRIMARY KEY (day, name)
);

CREATE TABLE tandem_traffic.routers (
    id BIGSERIAL PRIMARY KEY,
    name TEXT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    replica TEXT NOT NULL,
    detail TEXT NOT NULL,
    onnx BYTEA NOT NULL
);
"""

# One call per admitted request (sdk.serving.shared_limits.SharedClientLimits.admit): the address's failed-key
# backoff, then the client's token bucket, then its slot in flight, each only when the one before let it through,
# as the gate asks them one by one without a database. NULL arguments leave that limit out.
_V3 = """
CREATE FUNCTION tandem_admit(
    p_address TEXT, p_forget DOUBLE PRECISION,
    p_client TEXT, p_burst DOUBLE PRECISION, p_per_s DOUBLE PRECISION, p_now DOUBLE PRECISION,
    p_replica TEXT, p_max INTEGER
) RETURNS TABLE (backoff_wait DOUBLE PRECISION, rate_wait DOUBLE PRECISION, entered BOOLEAN)
LANGUAGE plpgsql AS $$
DECLARE
    f tandem_auth_failures%ROWTYPE;
    wait DOUBLE PRECISION := 0;
BEGIN
    IF p_address IS NOT NULL THEN
        SELECT * INTO f FROM tandem_auth_failures WHERE address = p_address;
        IF FOUND AND p_now - f.last_at < p_forget THEN
            wait := greatest(0, f.until_at - p_now);
        END IF;
        IF wait > 0 THEN
            RETURN QUERY SELECT wait, 0::DOUBLE PRECISION, NULL::BOOLEAN;
            RETURN;
        END IF;
    END IF;
    IF p_per_s IS NOT NULL THEN
        wait := tandem_take_token(p_client, p_burst, p_per_s, p_now);
        IF wait > 0 THEN
            RETURN QUERY SELECT 0::DOUBLE PRECISION, wait, NULL::BOOLEAN;
            RETURN;
        END IF;
    END IF;
    IF p_max IS NULL THEN
        RETURN QUERY SELECT 0::DOUBLE PRECISION, 0::DOUBLE PRECISION, NULL::BOOLEAN;
        RETURN;
    END IF;
    RETURN QUERY SELECT 0::DOUBLE PRECISION, 0::DOUBLE PRECISION, tandem_enter(p_client, p_replica, p_max);
END $$;

-- A request's slot in flight goes back (one statement: the row goes with its last slot).
CREATE FUNCTION tandem_leave(p_client TEXT, p_replica TEXT) RETURNS VOID
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE tandem_in_flight SET count = count - 1 WHERE client = p_client AND replica = p_replica;
    DELETE FROM tandem_in_flight WHERE client = p_client AND replica = p_replica AND count <= 0;
END $$;
"""

# Stored responses of POST /v1/responses (sdk.response_store.postgres_store): the columns of the SQLite store,
# so a conversation continues (previous_response_id) on whichever replica its next request reaches.
_V4 = """
CREATE TABLE tandem_responses (
    id TEXT PRIMARY KEY,
    key_fingerprint TEXT,
    created_at DOUBLE PRECISION NOT NULL,
    bytes INTEGER NOT NULL,
    conversation TEXT NOT NULL,
    response TEXT NOT NULL
);
CREATE INDEX tandem_responses_by_time ON tandem_responses (created_at);
"""

# Schema v5 (issue 66): the shared books under faults (_V5_BOOKS) and stored responses per key (_V5_RESPONSES).
#
# Settles land once (issue 66): a replica settles requests in batches (sdk.budgets.postgres_ledger), each
# one call of `tandem_settle_batch` keyed by the batch's id; a retry of a batch that already landed (its
# reply lost on the way back) finds the id in tandem_settled and changes nothing. The ids are kept a day
# (sdk.state.lease.SETTLED_KEEP).
# Slots in flight are rows per request (`slot`), so returning one is a DELETE that a retry repeats
# harmlessly; tandem_in_flight and tandem_enter/tandem_leave stay for replicas of schema 4 while a fleet
# upgrades (their counts are not added to these).
_V5_BOOKS = """
CREATE TABLE tandem_settled (
    batch TEXT PRIMARY KEY,
    replica TEXT NOT NULL,
    landed_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX tandem_settled_by_time ON tandem_settled (landed_at);

-- Release the batch's reservations and add, per (scope, period), what its requests cost: TRUE when applied
-- now, FALSE when this batch had landed before.
CREATE FUNCTION tandem_settle_batch(
    p_batch TEXT, p_replica TEXT, p_reservations BIGINT[], p_held_scopes TEXT[], p_held_periods TEXT[],
    p_scopes TEXT[], p_periods TEXT[], p_usd DOUBLE PRECISION[], p_cloud_tokens BIGINT[],
    p_total_tokens BIGINT[], p_requests BIGINT[]
) RETURNS BOOLEAN
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM tandem_lock_pairs(p_held_scopes || p_scopes, p_held_periods || p_periods);
    INSERT INTO tandem_settled (batch, replica) VALUES (p_batch, p_replica) ON CONFLICT (batch) DO NOTHING;
    IF NOT FOUND THEN
        RETURN FALSE;
    END IF;
    DELETE FROM tandem_reservations WHERE id = ANY(p_reservations);
    INSERT INTO tandem_spend AS sp (scope, period, usd, cloud_tokens, total_tokens, requests)
        SELECT p_scopes[j], p_periods[j], p_usd[j], p_cloud_tokens[j], p_total_tokens[j], p_requests[j]
        FROM generate_subscripts(p_scopes, 1) AS j
        ON CONFLICT (scope, period) DO UPDATE SET
            usd = sp.usd + excluded.usd,
            cloud_tokens = sp.cloud_tokens + excluded.cloud_tokens,
            total_tokens = sp.total_tokens + excluded.total_tokens,
            requests = sp.requests + excluded.requests;
    RETURN TRUE;
END $$;

CREATE TABLE tandem_in_flight_requests (
    slot TEXT PRIMARY KEY,
    client TEXT NOT NULL,
    replica TEXT NOT NULL
);
CREATE INDEX tandem_in_flight_requests_by_client ON tandem_in_flight_requests (client);
CREATE INDEX tandem_in_flight_requests_by_replica ON tandem_in_flight_requests (replica);

-- Take slot p_slot for a client on a replica, unless live replicas already hold p_max of its (a slot taken
-- before, by a retried call, is TRUE again).
CREATE FUNCTION tandem_enter_slot(p_client TEXT, p_replica TEXT, p_slot TEXT, p_max INTEGER) RETURNS BOOLEAN
LANGUAGE plpgsql AS $$
DECLARE
    n BIGINT;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('in-flight|' || p_client, 0));
    IF EXISTS (SELECT 1 FROM tandem_in_flight_requests WHERE slot = p_slot) THEN
        RETURN TRUE;
    END IF;
    SELECT count(*) INTO n FROM tandem_in_flight_requests f JOIN tandem_replicas p ON p.id = f.replica
        WHERE f.client = p_client AND p.expires_at > now();
    IF n >= p_max THEN
        RETURN FALSE;
    END IF;
    INSERT INTO tandem_in_flight_requests VALUES (p_slot, p_client, p_replica);
    RETURN TRUE;
END $$;

-- tandem_admit's backoff and rate limit, then a slot of its own for the request (tandem_enter_slot).
CREATE FUNCTION tandem_admit_slot(
    p_address TEXT, p_forget DOUBLE PRECISION,
    p_client TEXT, p_burst DOUBLE PRECISION, p_per_s DOUBLE PRECISION, p_now DOUBLE PRECISION,
    p_replica TEXT, p_max INTEGER, p_slot TEXT
) RETURNS TABLE (backoff_wait DOUBLE PRECISION, rate_wait DOUBLE PRECISION, entered BOOLEAN)
LANGUAGE plpgsql AS $$
DECLARE
    r RECORD;
BEGIN
    SELECT * INTO r FROM tandem_admit(p_address, p_forget, p_client, p_burst, p_per_s, p_now, p_replica, NULL);
    IF r.backoff_wait > 0 OR r.rate_wait > 0 OR p_max IS NULL THEN
        RETURN QUERY SELECT r.backoff_wait, r.rate_wait, NULL::BOOLEAN;
        RETURN;
    END IF;
    RETURN QUERY SELECT 0::DOUBLE PRECISION, 0::DOUBLE PRECISION, tandem_enter_slot(p_client, p_replica, p_slot, p_max);
END $$;
"""

_V5_RESPONSES = """
-- Stored responses per key (sdk.response_store.postgres_store): the bytes each key's rows hold, kept by a
-- trigger (so every delete counts), and tandem_keep_response, which stores one and trims only its own key's
-- oldest rows, to its share and to what the others leave of the whole store: a key's puts never delete
-- another key's rows. Retention and owner migrations take the store's advisory lock (RESPONSES_LOCK there),
-- one at a time, so their many-row deletes and updates never deadlock each other on the counts.
CREATE INDEX tandem_responses_by_owner ON tandem_responses ((coalesce(key_fingerprint, '')), created_at);

CREATE TABLE tandem_response_owners (
    owner TEXT PRIMARY KEY,  -- a key's id; '' for a server without keys
    bytes BIGINT NOT NULL
);
INSERT INTO tandem_response_owners SELECT coalesce(key_fingerprint, ''), sum(bytes) FROM tandem_responses GROUP BY 1;

CREATE FUNCTION tandem_count_response() RETURNS TRIGGER
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('DELETE', 'UPDATE') THEN
        UPDATE tandem_response_owners SET bytes = bytes - OLD.bytes WHERE owner = coalesce(OLD.key_fingerprint, '');
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        INSERT INTO tandem_response_owners VALUES (coalesce(NEW.key_fingerprint, ''), NEW.bytes)
            ON CONFLICT (owner) DO UPDATE SET bytes = tandem_response_owners.bytes + excluded.bytes;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER tandem_responses_counted AFTER INSERT OR DELETE OR UPDATE OF key_fingerprint, bytes
    ON tandem_responses FOR EACH ROW EXECUTE FUNCTION tandem_count_response();

-- Store a response and trim its key's oldest rows to its share and to what the others leave of the whole store:
-- TRUE when it is kept, FALSE (nothing deleted) when its key's older rows free too little of a full store.
-- One key's puts run one at a time, on any replica.
CREATE FUNCTION tandem_keep_response(
    p_id TEXT, p_owner TEXT, p_created_at DOUBLE PRECISION, p_bytes INTEGER, p_conversation TEXT, p_response TEXT,
    p_max_per_key BIGINT, p_max_bytes BIGINT
) RETURNS BOOLEAN
LANGUAGE plpgsql AS $$
DECLARE
    own BIGINT;
    total BIGINT;
    excess BIGINT;
    room BIGINT;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('responses|' || coalesce(p_owner, ''), 0));
    SELECT coalesce(max(bytes), 0) INTO own FROM tandem_response_owners WHERE owner = coalesce(p_owner, '');
    SELECT coalesce(sum(bytes), 0) INTO total FROM tandem_response_owners;
    excess := total + p_bytes - p_max_bytes;  -- what must go for it to fit the whole store
    IF excess > own THEN  -- this key's older rows free too little: nothing goes, and it is not kept
        RETURN FALSE;
    END IF;
    INSERT INTO tandem_responses VALUES (p_id, p_owner, p_created_at, p_bytes, p_conversation, p_response)
        ON CONFLICT (id) DO NOTHING;
    room := least(p_max_per_key, own + p_bytes - greatest(0, excess));
    IF own + p_bytes > room THEN
        DELETE FROM tandem_responses WHERE id IN (
            SELECT id FROM (
                SELECT id, sum(bytes) OVER (ORDER BY id = p_id DESC, created_at DESC, id DESC) AS kept
                FROM tandem_responses WHERE coalesce(key_fingerprint, '') = coalesce(p_owner, '')
            ) AS running WHERE kept > room
        );
    END IF;
    RETURN TRUE;
END $$;
"""

# (version, SQL): applied in order, each in the transaction that records it.
MIGRATIONS: list[tuple[int, str]] = [(1, _V1), (2, _V2), (3, _V3), (4, _V4), (5, _V5_BOOKS + _V5_RESPONSES)]

LATEST = MIGRATIONS[-1][0]
