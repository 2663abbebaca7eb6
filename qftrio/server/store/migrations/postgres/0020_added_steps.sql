-- qftrio schema, version 0020: steps added at run time (DESIGN §4).
--
-- added_by names the step that added a step (NULL for the workflow's own);
-- collect the context key its result is gathered under. qftrio_workflow_collects
-- counts, per key (owned by the step that added them), the collected steps not completed yet: the last one to
-- complete writes the whole list into the context, so that no completion
-- before it rewrites a list that grows with the workflow. Adding a column
-- with a constant default or none rewrites no row.
-- steps_added counts a workflow's added steps, which a cap bounds.
ALTER TABLE qftrio_workflows ADD COLUMN steps_added integer NOT NULL DEFAULT 0;
ALTER TABLE qftrio_workflow_steps ADD COLUMN added_by text;
ALTER TABLE qftrio_workflow_steps ADD COLUMN collect text;
CREATE INDEX qftrio_workflow_steps_collected_idx ON qftrio_workflow_steps (workflow_id, collect, position)
    WHERE collect IS NOT NULL;
CREATE TABLE qftrio_workflow_collects (
    workflow_id     uuid NOT NULL REFERENCES qftrio_workflows (id) ON DELETE CASCADE,
    key             text NOT NULL,
    added_by        text NOT NULL,
    remaining       integer NOT NULL,
    PRIMARY KEY (workflow_id, key)
);
