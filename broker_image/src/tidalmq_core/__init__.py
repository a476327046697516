"""Pure logic shared by every TidalMQ component: the metadata model, placement and balancing,
the reassignment state machine and the static-topic mapping algebra. No I/O, no imports of the
other TidalMQ packages (enforced by import-linter)."""
