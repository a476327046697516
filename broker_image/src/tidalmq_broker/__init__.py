"""The TidalMQ broker: Kafka wire protocol (protocol/, server/, apis/), stream storage on object
storage (storage/), group coordination (groups/), the embedded local cluster (local/) and the
`tidalmq` command line (cli.py). The controller is the package tidalmq_controller."""

__version__ = "0.1.0"
