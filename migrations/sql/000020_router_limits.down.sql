DROP TABLE outbox_router_leaders;
DROP TABLE outbox_router_permits;
DROP TABLE outbox_router_limits;
