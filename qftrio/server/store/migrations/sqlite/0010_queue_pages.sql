-- qftrio embedded schema: a tenant's paused queues in name order, so that a
-- page of its queues (queues_page) reads a page's worth of them, however
-- many queues other tenants paused.
CREATE INDEX queue_pauses_by_tenant ON queue_pauses (tenant, queue);
