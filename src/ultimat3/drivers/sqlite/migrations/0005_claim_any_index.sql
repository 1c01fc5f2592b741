-- PostgreSQL's 0005 narrows its all-queues claim index so a one-queue claim cannot pick it. SQLite
-- claims walk their own indexes (see 0001), which need no change; the file keeps the ledgers of
-- both drivers in step (x:0005_claim_any_index is applied everywhere).
SELECT 1;
