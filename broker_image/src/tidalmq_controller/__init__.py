"""The controller: single writer of cluster metadata (topics, assignment, epochs, moves)."""
