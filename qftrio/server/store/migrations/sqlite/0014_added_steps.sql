-- qftrio embedded schema, version 0014: steps added at run time.
--
-- added_by names the step that added a step (NULL for the workflow's own);
-- collect the context key its result is gathered under. workflow_collects
-- counts, per key (owned by the step that added them), the collected steps not completed yet: the last one to
-- complete writes the whole list into the context, so that no completion
-- before it rewrites a list that grows with the workflow.
-- steps_added counts a workflow's added steps, which a cap bounds.
ALTER TABLE workflows ADD COLUMN steps_added INTEGER NOT NULL DEFAULT 0;
ALTER TABLE workflow_steps ADD COLUMN added_by TEXT;
ALTER TABLE workflow_steps ADD COLUMN collect TEXT;
CREATE INDEX workflow_steps_collected ON workflow_steps (workflow_id, collect, position) WHERE collect IS NOT NULL;
CREATE TABLE workflow_collects (
    workflow_id TEXT NOT NULL,
    key TEXT NOT NULL,
    added_by TEXT NOT NULL,
    remaining INTEGER NOT NULL,
    PRIMARY KEY (workflow_id, key)
) WITHOUT ROWID;
