"""``python -m bench.kafka``: the harness CLI (same as bench/kafka/kafka)."""

import sys

from bench.kafka.harness import main

sys.exit(main())
