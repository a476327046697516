"""Pure logic shared by every TidalMQ component: the metadata model, placement and balancing,
the reassignment state machine, the static-topic mapping algebra and a static topic's
description. No I/O, no imports of the other TidalMQ packages (enforced by import-linter)."""
