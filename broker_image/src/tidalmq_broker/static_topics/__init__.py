"""Static topics (seed 002): a fixed number of logic queues over remappable physical queues.

`manager`: the controller's half (create, remap, repair, cleanup); `service`: the brokers' half
(Produce, Fetch, ListOffsets and committed offsets on logic queues); `cli`: `tidalmq
static-topic`."""
