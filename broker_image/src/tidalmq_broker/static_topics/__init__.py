"""Static topics: a fixed number of logic queues over remappable physical queues.

The brokers' half: `service` (Produce, Fetch, ListOffsets and committed offsets on logic
queues); `cli`: `tidalmq static-topic`. The controller's half (create, remap, repair, cleanup)
is the static-topics manager of `tidalmq_controller`; what a static topic looks like is
`tidalmq_core.static_description`."""
