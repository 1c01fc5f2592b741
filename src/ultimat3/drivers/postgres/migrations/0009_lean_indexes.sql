-- x_jobs_run_idx goes (issue 13): every job's write -- its insert, its claim, its ack -- put an
-- entry in it (an update that changes the state cannot be HOT, so it writes every index), and it
-- served one question only: whether another job still points at a run whose job is deleted. None
-- can: a run id is minted with its job and no other job ever carries it, so deleting a job (prune,
-- x jobs delete) takes its run's steps without asking. bench/index_cost.py measures what each
-- index costs an insert.
DROP INDEX IF EXISTS x_jobs_run_idx;
