-- qftrio schema: a tenant's paused queues in name order, so that a page of
-- its queues (queues_page) reads a page's worth of them, however many queues
-- other tenants paused.
CREATE INDEX qftrio_queue_pauses_tenant_idx ON qftrio_queue_pauses (tenant, queue);
